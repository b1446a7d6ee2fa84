"""Prompt length for a plan: tokenise a sample of the run's own prompts when that is possible offline."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path


@contextlib.contextmanager
def _offline():
    """Offline for what runs inside, and only for that. huggingface_hub reads HF_HUB_OFFLINE once, when it
    is first imported: imported here first with the environment as it was, and its flag set and restored
    around the block, so that a run which plans its prompts (every run: tinyrl.planner.preflight) does
    not stay offline afterwards."""
    try:
        from huggingface_hub import constants
    except ImportError:
        constants = None
    old = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    old_flag = getattr(constants, "HF_HUB_OFFLINE", None)
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if constants is not None:
            constants.HF_HUB_OFFLINE = old_flag


def _local_tokenizer(cfg_model):
    """The run's tokenizer if it is on disk (shipped model, local folder, HF cache), else None."""
    # lazy: the loader and the data pipeline bring torch/transformers, which planning alone never needs
    from tinyrl.model import BUILTIN_MODELS, load_tokenizer, resolve_model

    name = cfg_model.name
    if name not in BUILTIN_MODELS and not Path(name).expanduser().exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            if not isinstance(try_to_load_from_cache(name, "tokenizer_config.json"), str):
                return None
        except Exception:  # noqa: BLE001
            return None
    with _offline():
        return load_tokenizer(resolve_model(name, cfg_model.gguf_file))


def measure_prompt_tokens(cfg, sample: int = 64) -> tuple[int, str] | None:
    """(longest prompt in tokens over `sample` training rows, how it was found), or None.

    None when the data or the tokenizer is not available offline (e.g. a GSM8K file not given)."""
    from tinyrl.data import load_rows, render_prompt  # lazy: tinyrl.data imports torch (see above)

    try:
        data = dataclasses.replace(cfg.data, num_train=min(cfg.data.num_train, sample), num_eval=0)
        with _offline():  # a hub dataset (data.dataset, the gsm8k task) from the local cache only: plans never download
            rows, _, _ = load_rows(data)
        tok = _local_tokenizer(cfg.model)
        if tok is None or not rows:
            return None
        lengths = [len(tok(render_prompt(tok, r["prompt"], cfg.data), add_special_tokens=False)["input_ids"])
                   for r in rows]
    except Exception:  # noqa: BLE001  (any missing piece: the caller falls back to a typical length)
        return None
    return max(lengths), f"longest of {len(lengths)} tokenised training prompts"
