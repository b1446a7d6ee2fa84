"""The policy model: loading it (`load`) apart from what it computes with (`forward`).

`tinyrl.model.load`: resolve a model name offline, the tokenizer, the base model (4-bit nf4 for
QLoRA), the LoRA adapter, saved adapters, the backends (`model.backend`). `tinyrl.model.forward`:
decoder internals (the decoder stack, prompt caches, merged-LoRA linears, the output projection,
the reference context). Both modules' public functions are re-exported here; a module setting
that tests patch (`forward.MIN_SHARED_PREFIX`) is not, so that a patch reaches the code that reads it.
"""

from tinyrl.errors import ModelLoadError
from tinyrl.model.forward import (
    MERGE_SHARE,
    attention_implementation,
    cache_kwarg,
    caches_under_autograd,
    common_prefix_length,
    full_attention_only,
    lm_head_of,
    merge_budget,
    merged_lora_linears,
    output_projection,
    packed_hidden,
    positions,
    prefix_cache,
    prompt_cache,
    reference_context,
    trunk_of,
)
from tinyrl.model.load import (
    ADAPTER_FILES,
    BUILTIN_MODELS,
    ResolvedModel,
    add_lora,
    check_adapter_folder,
    check_finite_weights,
    check_target_modules,
    checkpointing_on,
    drop_dequantized_gguf_marker,
    dtype_name,
                                  keep_4bit_weights_trainable,
    load_base_model,
    load_policy,
    load_tokenizer,
    quiet_third_party_noise,
    release_weight_file,
    resolve_adapter,
    resolve_model,
)

__all__ = ["ADAPTER_FILES", "BUILTIN_MODELS", "MERGE_SHARE", "ModelLoadError", "ResolvedModel",
           "add_lora", "attention_implementation", "cache_kwarg", "caches_under_autograd", "check_adapter_folder",
           "check_finite_weights", "check_target_modules", "checkpointing_on", "common_prefix_length",
           "drop_dequantized_gguf_marker", "dtype_name", "full_attention_only", "keep_4bit_weights_trainable", "lm_head_of",
           "load_base_model", "load_policy", "load_tokenizer", "merge_budget", "merged_lora_linears",
           "output_projection", "packed_hidden", "positions", "prefix_cache", "prompt_cache", "quiet_third_party_noise",
           "reference_context", "release_weight_file", "resolve_adapter", "resolve_model", "trunk_of"]
