"""Export a finished run: its base model with the trained LoRA adapter merged in, as a plain model folder.

    tinyrl export RUN_DIR --merged OUT [--dtype bfloat16|float16|float32]

writes OUT/ with config.json, model.safetensors (sharded when large), generation_config.json, the
tokenizer, a README.md model card (tinyrl.hub_push) and export.json (what was merged, from where).
It loads in transformers (`AutoModelForCausalLM.from_pretrained(OUT)`) and in vLLM (`vllm.LLM(OUT)`)
with no peft, and its greedy output equals the run's base model + adapter.

A QLoRA run (model.load_in_4bit) or an int8/fp8 run (model.quantization) trained its adapter over a
quantized base; the export never merges into those weights (merging into nf4 rounds the adapter away
and leaves a model nothing but bitsandbytes loads): the base is reloaded unquantized in `dtype` and the
adapter merged there. The merged model is therefore the 16-bit base + adapter, not the nf4 base +
adapter that the run's rollouts sampled (they differ by the base's quantization error).

peft merges in float32 on a CPU (`W + B @ A * scale`, rounded once to `dtype`), so a bfloat16 export
costs no more memory than the base in bfloat16. Everything is written to a temporary folder beside
OUT and renamed in when complete: a crash leaves no half-written OUT.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from pathlib import Path

from tinyrl.errors import ConfigError
from tinyrl.hub_push import model_card
from tinyrl.model.load import (
    ResolvedModel,
    check_adapter_folder,
    load_base_model,
    quiet_third_party_noise,
    resolve_model,
)
from tinyrl.version import __version__

log = logging.getLogger("tinyrl.export")

DTYPES = ("bfloat16", "float16", "float32")  # what --dtype accepts (float32: CPU checks, no 16-bit rounding)
EXPORT_INFO = "export.json"


def run_adapter(run_dir: str | Path) -> Path:
    """The final adapter folder of a run folder; ConfigError naming RUN_DIR and what is missing."""
    run = Path(run_dir).expanduser()
    if not run.is_dir():
        raise ConfigError(f"RUN_DIR {run}: no such run folder")
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"RUN_DIR {run}: not a tinyrl run folder (no config.yaml)")
    adapter = run / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        ckpts = sorted(run.glob("checkpoints/step-*/adapter"))
        hint = (f"; its latest checkpoint's adapter is {ckpts[-1]} (finish the run with "
                f"`tinyrl train --resume {run}`)" if ckpts else "")
        raise ConfigError(f"RUN_DIR {run}: the run has no final adapter ({adapter} is missing: "
                          f"interrupted, or still training?){hint}")
    check_adapter_folder(str(adapter))  # ModelLoadError naming a missing or corrupt file
    return adapter


def check_choice(flag: str, value, allowed) -> str:
    """`value` if it is one of `allowed`, else a ConfigError naming the flag, the allowed values and the value."""
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{flag}: must be one of {list(allowed)}, got {value!r}")
    return value


def check_dtype(dtype: str) -> str:
    return check_choice("--dtype", dtype, DTYPES)


def check_out(out: str | Path) -> Path:
    """OUT as a path to write: new, or an empty folder (ConfigError otherwise: nothing is overwritten)."""
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--merged {out}: exists and is not an empty folder; give a new folder "
                          f"(an export never overwrites)")
    return out


def merged_model(run_dir: str | Path, cfg, dtype: str = "bfloat16"):
    """(merged transformers model, tokenizer, base ResolvedModel): the run's base (`cfg`, the run's own config
    as the caller resolved it) loaded unquantized in `dtype`, its adapter applied with peft and merged
    (`merge_and_unload`)."""
    from peft import PeftModel

    check_dtype(dtype)
    adapter = run_adapter(run_dir)
    model_cfg = dataclasses.replace(cfg.model, dtype=dtype, load_in_4bit=False, quantization="none")
    resolved = resolve_model(model_cfg.name, model_cfg.gguf_file)
    quiet_third_party_noise()
    base = load_base_model(model_cfg, resolved)
    quantizer = getattr(base, "hf_quantizer", None)
    if quantizer is not None:  # a checkpoint stored quantized (a *-bnb-4bit upload, packed GGUF): no 16-bit base
        method = getattr(quantizer.quantization_config, "quant_method", "?")
        method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
        raise ConfigError(f"model.name: {model_cfg.name!r} is stored quantized ({method}); a merged export needs "
                          f"its unquantized weights. Push the adapter alone (--push without --merged), or merge "
                          f"it into the unquantized release of the same model")
    untie_if_adapted(base, adapter)
    model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    model.config.use_cache = True  # load_base_model turns it off for training; generation wants it
    return model, _tokenizer(resolved), resolved


def untie_if_adapted(model, adapter: Path) -> bool:
    """Give lm_head a weight of its own when it is tied to the input embeddings and the adapter changes
    one of the two: merged in place, the delta would land in both (and the config would re-tie them at
    load). Returns whether it untied."""
    import torch

    targets = json.loads((adapter / "adapter_config.json").read_text()).get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    touched = any(t in ("lm_head", "embed_tokens") or t.endswith((".lm_head", ".embed_tokens")) for t in targets)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if not touched or head is None or emb is None or head.weight is not emb.weight:
        return False
    head.weight = torch.nn.Parameter(emb.weight.detach().clone(), requires_grad=False)
    model.config.tie_word_embeddings = False
    text_cfg = getattr(model.config, "get_text_config", lambda: None)()
    if text_cfg is not None:
        text_cfg.tie_word_embeddings = False
    return True


def _tokenizer(resolved: ResolvedModel):
    """The base's tokenizer as it ships (the trainer's copy is padded left; an export keeps the original)."""
    from transformers import AutoTokenizer

    kw = {"gguf_file": resolved.gguf_file} if resolved.gguf_file else {}
    return AutoTokenizer.from_pretrained(resolved.path, **kw)


def export_merged(run_dir: str | Path, out: str | Path, cfg, dtype: str = "bfloat16") -> Path:
    """Write the run's merged model to `out` (see the module docstring); returns `out`. `cfg`: the run's own
    config (config.yaml), resolved once by the caller (tinyrl.api.export)."""
    check_dtype(dtype)
    out = check_out(out)
    model, tok, _ = merged_model(run_dir, cfg, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()  # (not mkdtemp: its 0700 would become OUT's mode)
    try:
        model.save_pretrained(tmp)
        if not (tmp / "generation_config.json").exists() and model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        info = {"run": Path(run_dir).resolve().name, "base_model": cfg.model.name, "dtype": dtype,
                "trained_quantized": _quantized(cfg), "tinyrl_version": __version__}
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
        (tmp / "README.md").write_text(model_card(run_dir, kind="merged", dtype=dtype))
        check_out(out)  # still free
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("merged model (%s) written to %s", dtype, out)
    return out


def _quantized(cfg) -> str | None:
    """How the run held its base while training: nf4 (QLoRA), int8 / fp8, or None (unquantized)."""
    if cfg.model.load_in_4bit:
        return "nf4"
    return None if cfg.model.quantization == "none" else cfg.model.quantization
