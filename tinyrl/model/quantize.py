"""`model.quantization: int8 | fp8`: the frozen base's linears quantized weight-only through torchao.

Each decoder linear's weight becomes a torchao tensor subclass (`Int8Tensor` / `Float8Tensor`):
one byte a parameter plus one scale per output row (`PerRow`, torchao's default for both). The
embeddings, the output head and the norms stay in the model dtype, as vLLM's torchao method leaves
them (it quantizes only its `LinearBase` layers), so the HF engine's base and vLLM's are the same
numbers. peft wraps these linears as `TorchaoLoraLinear` and trains the LoRA adapter on them; the
reference policy is the adapter disabled, as for every base.

Row scales make a fused matrix and its row slices quantize alike: vLLM's fused q/k/v (or
gate/up) quantized at once equals q, k and v quantized one by one, which is what lets the
trainer's linears be row-slice views of vLLM's tensors (`tinyrl.rollout.vllm`).

What tinyrl relies on in torchao lives here (`TORCHAO_INTERNALS`); the test
`tests/test_quantization_int8.py::test_pinned_torchao_internals` fails loudly when a torchao
release moves one. torchao is an optional dependency: `pip install 'tinyrl-rlvr[torchao]'`.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

from tinyrl.errors import MissingExtra, ModelLoadError
from tinyrl.registry import Registry

log = logging.getLogger("tinyrl.model.quantize")

TORCHAO_RANGE = ("0.18.0", "0.19.0")  # [lo, hi): the releases this module and vLLM 0.32's torchao method pair with
MISSING = "model.quantization {name!r} needs torchao: pip install 'tinyrl-rlvr[torchao]'"
# model.quantization -> the torchao config class (weight-only: activations stay in the model dtype)
QUANTIZATIONS = Registry("model.quantization", {
    "int8": "torchao.quantization:Int8WeightOnlyConfig",
    "fp8": "torchao.quantization:Float8WeightOnlyConfig",
})
TENSOR_TYPES = {"int8": "Int8Tensor", "fp8": "Float8Tensor"}  # the weight subclass each one makes
TORCHAO_INTERNALS = {  # what tinyrl uses beyond quantize_; pinned by a test
    "torchao.quantization": ("quantize_", "Int8WeightOnlyConfig", "Float8WeightOnlyConfig", "Int8Tensor",
                             "Float8Tensor", "PerRow"),
    "torchao.core.config": ("config_to_dict",),
    "torchao.utils": ("TorchAOBaseTensor",),
    "tensor": ("qdata", "scale", "dequantize", "tensor_data_names"),  # on Int8Tensor / Float8Tensor
}


def import_torchao(name: str = "int8"):
    """`torchao`, version-checked; ImportError naming the extra when it is missing."""
    quiet_import_noise()
    try:
        import torchao
    except ImportError as e:
        raise MissingExtra(MISSING.format(name=name)) from e
    from packaging.version import Version

    v = Version(Version(torchao.__version__).base_version)
    if not Version(TORCHAO_RANGE[0]) <= v < Version(TORCHAO_RANGE[1]):
        raise ModelLoadError(f"model.quantization {name!r}: tinyrl supports torchao>={TORCHAO_RANGE[0]},"
                             f"<{TORCHAO_RANGE[1]}; this is torchao {torchao.__version__}. Install a supported "
                             f"one: pip install 'tinyrl-rlvr[torchao]'")
    return torchao


class _DropMessage(logging.Filter):
    def __init__(self, *texts: str):
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(t in record.getMessage() for t in self.texts)


_IMPORT_NOISE = _DropMessage("Failed to load", "Could not load this library", "is an Enum subclass")


def quiet_import_noise() -> None:
    """torchao's import logs that its CUDA-only extensions (mxfp8, cutlass) do not load on this machine,
    and torch that torchao registers Enums the old way: neither says anything about a run. transformers
    and peft import torchao wherever it is installed (a 16-bit run too), so this runs when this module
    is imported (tinyrl.model is, before the trainer imports peft): two logging filters, nothing else."""
    for name in ("torchao", "torch.utils._pytree"):
        logger = logging.getLogger(name)
        if _IMPORT_NOISE not in logger.filters:
            logger.addFilter(_IMPORT_NOISE)


quiet_import_noise()


def ao_config(name: str):
    """The torchao config object for `model.quantization` `name` (int8 / fp8)."""
    import_torchao(name)
    return QUANTIZATIONS[name]()


def is_quantized(t) -> bool:
    """Whether `t` is a torchao quantized tensor (never imports torchao: no torchao, no such tensor)."""
    utils = sys.modules.get("torchao.utils")
    return utils is not None and isinstance(t, utils.TorchAOBaseTensor)


def transformers_config(name: str):
    """transformers' `TorchAoConfig` for `from_pretrained`: each linear quantized as it loads (transformers
    leaves the output head unquantized), and peft finds in it how to re-quantize after a merge."""
    from transformers import TorchAoConfig

    return TorchAoConfig(quant_type=ao_config(name))


def quantize_base(model, name: str) -> int:
    """Quantize a loaded `model`'s linears weight-only in place (not the output head); returns how many.
    (A GGUF model, de-quantized at load: the others are quantized as they load, `transformers_config`.)"""
    import torch

    cfg = ao_config(name)
    from torchao.quantization import quantize_

    head = model.get_output_embeddings()
    chosen = [fqn for fqn, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    keep = set(chosen)
    with torch.no_grad():
        quantize_(model, cfg, filter_fn=lambda m, fqn: fqn in keep)
    return len(chosen)


def log_quantized(model, name: str) -> int:
    """Log (and return) how many weights of `model` are quantized, and what stays in the model dtype."""
    n = sum(1 for p in model.parameters() if is_quantized(p))
    log.info("model.quantization %s: %d linears quantized weight-only (%s); embeddings, head and norms "
             "stay %s", name, n, TENSOR_TYPES[name], model.get_input_embeddings().weight.dtype)
    return n


def quantized_bytes(t) -> int:
    """The bytes a (torchao quantized or plain) tensor holds: its data plus its scales."""
    if is_quantized(t):
        return sum(getattr(t, n).numel() * getattr(t, n).element_size() for n in t.tensor_data_names)
    return t.numel() * t.element_size()


def inner_tensors(t) -> list:
    """The plain tensors holding `t`'s memory (a quantized tensor's data and scales; else `t`)."""
    return [getattr(t, n) for n in t.tensor_data_names] if is_quantized(t) else [t]


def vllm_quantization(name: str) -> dict:
    """vLLM `LLM(...)` keywords that quantize the base at load as `ao_config(name)` does here."""
    from torchao.core.config import config_to_dict

    cfg = ao_config(name)
    return {"quantization": "torchao",
            "hf_overrides": {"quantization_config_dict_json": json.dumps(config_to_dict(cfg))}}


def quiet_peft_merge_warning() -> None:
    """peft warns on every `TorchaoLoraLinear` that it cannot merge() without transformers'
    TorchAoConfig: tinyrl never merges into the quantized base (export dequantizes to 16-bit)."""
    warnings.filterwarnings("ignore", message=r"TorchaoLoraLinear was instantiated without", category=UserWarning)
