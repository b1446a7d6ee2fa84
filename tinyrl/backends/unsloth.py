"""`model.backend: unsloth`: load the policy through Unsloth's FastLanguageModel (CUDA only).

Every unsloth import in tinyrl is in this file. Unsloth loads the base (bf16/fp16, or its
4-bit nf4 for `model.load_in_4bit`), patches the model's forward with its kernels, adds the
LoRA adapter with `FastLanguageModel.get_peft_model` and, with
`model.gradient_checkpointing: true`, its own offloading gradient checkpointing
(`use_gradient_checkpointing="unsloth"`). What comes back is a peft model like the
transformers backend's, so the rest of the loop (rollout engines, the fused loss on the
decoder stack's hidden states, adapter saving and sync) is unchanged.

Signatures read from unslothai/unsloth: `FastLanguageModel.from_pretrained(model_name,
max_seq_length=2048, dtype=None, load_in_4bit=True, ..., use_gradient_checkpointing="unsloth",
fast_inference=False, ...)` (unsloth/models/loader.py) and
`FastLanguageModel.get_peft_model(model, r=16, target_modules=[...], lora_alpha=16,
lora_dropout=0.0, bias="none", use_gradient_checkpointing="unsloth", random_state=3407, ...)`
(unsloth/models/llama.py), which accepts only the projection names (q/k/v/o/gate/up/down,
lm_head), not peft's "all-linear".

Unsloth wants to be imported before transformers to patch it fully; tinyrl imports it when
the model is loaded, after transformers, so unsloth warns and applies the patches it can.
"""

from __future__ import annotations

import importlib.util

from tinyrl.errors import ModelLoadError

EXTRA = "pip install 'tinyrl-rlvr[unsloth]'"
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def check_available() -> None:
    """Raise ModelLoadError naming the extra unless a CUDA GPU and unsloth are both present."""
    import torch

    if not torch.cuda.is_available():
        raise ModelLoadError(f"model.backend 'unsloth' needs a CUDA GPU (Unsloth's kernels do not run on a "
                             f"CPU) and the unsloth extra ({EXTRA}); on this machine use model.backend: "
                             f"transformers")
    if importlib.util.find_spec("unsloth") is None:
        raise ModelLoadError(f"model.backend 'unsloth' needs the unsloth extra: {EXTRA} "
                             f"(or use model.backend: transformers)")


def target_modules(spec) -> list[str]:
    """peft's target_modules in the form get_peft_model takes ("all-linear" -> the seven projections)."""
    if spec == "all-linear":
        return list(PROJECTIONS)
    return [spec] if isinstance(spec, str) else list(spec)


def load_policy(cfg_model, cfg_lora, resolved, adapter: str | None = None, *, checkpointing: bool = False):
    """(peft model, tokenizer) loaded through FastLanguageModel; `adapter` loads saved LoRA weights;
    `checkpointing`: Unsloth's own gradient checkpointing (the loader's `checkpointing_on`, decided
    there: this module imports nothing of tinyrl.model, which imports it)."""
    check_available()
    if resolved.gguf_file:
        raise ModelLoadError(f"model.backend 'unsloth' cannot load the GGUF file {resolved.gguf_file!r}; "
                             f"give a safetensors model folder or hub id")
    import torch
    from unsloth import FastLanguageModel  # GPU-only, optional: the one import of unsloth

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg_model.dtype]
    use_checkpointing = "unsloth" if checkpointing else False
    model, tok = FastLanguageModel.from_pretrained(
        model_name=resolved.path, dtype=dtype, load_in_4bit=cfg_model.load_in_4bit,
        use_gradient_checkpointing=use_checkpointing, fast_inference=False)
    if adapter is None:
        model = FastLanguageModel.get_peft_model(
            model, r=cfg_lora.r, lora_alpha=cfg_lora.alpha, lora_dropout=cfg_lora.dropout,
            target_modules=target_modules(cfg_lora.target_modules), bias="none",
            use_gradient_checkpointing=use_checkpointing)
    else:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
        except (ValueError, RuntimeError, OSError) as e:
            raise ModelLoadError(f"adapter {adapter!r} does not fit model {cfg_model.name!r}: {e}") from e
    FastLanguageModel.for_training(model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok
