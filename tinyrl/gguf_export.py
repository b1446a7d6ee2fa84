"""Export a finished run as one GGUF file, for llama.cpp, Ollama and LM Studio.

    tinyrl export RUN_DIR --gguf OUT.gguf [--gguf-type f16|bf16|q8_0|f32]

The run's base model and adapter are merged in float32 (`tinyrl.exporter.merged_model`), then each tensor
is renamed, laid out and cast the way llama.cpp's own converter (convert_hf_to_gguf.py) does it:

- names from the `gguf` package's tables (`gguf.get_tensor_name_map` for the architecture), not a map
  of our own; an architecture not in `ARCHS` is refused by name;
- the llama family (llama, SmolLM2, the tiny models, mistral) stores q_proj / k_proj rows permuted for
  llama.cpp's rope on adjacent pairs; qwen2 / qwen3 (neox rope) are stored as they are;
- 1-D tensors and norms stay float32; every other weight becomes `gguf_type` (q8_0 through
  `gguf.quants`, falling back to f16 for a shape it cannot block, as the converter does);
- lm_head is left out when it is tied to the input embeddings (llama.cpp reuses token_embd).

The hyper-parameters go in under the gguf keys the converter writes, and the tokenizer (vocabulary,
merges, special tokens, chat template) through `tinyrl.gguf_vocab`. The file is written beside OUT under
a temporary name and linked in only when complete, never over an existing file. The tests compare the
result with the merged model in transformers (logits), with llama.cpp's own output (its server engine, the xllamacpp wheel)
and with convert_hf_to_gguf.py's tensors (tests/test_gguf_export.py, tests/test_gguf_llama_cpp.py).

Memory: the float32 merge holds 4 bytes per parameter, and the converted tensors one more copy at the
GGUF type until the file is written.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tinyrl.errors import ConfigError, MissingExtra
from tinyrl.exporter import check_choice

log = logging.getLogger("tinyrl.export")

GGUF_TYPES = ("f16", "bf16", "q8_0", "f32")  # what --gguf-type accepts
MISSING = "--gguf needs the gguf package: pip install 'tinyrl-rlvr[gguf]'"


@dataclass(frozen=True)
class Arch:
    """How one transformers model_type is written: the gguf.MODEL_ARCH member, and whether q/k are permuted."""

    gguf_arch: str
    permute_qk: bool  # llama.cpp's llama graph ropes adjacent pairs; HF's llama ropes the two halves


ARCHS = {  # transformers model_type -> GGUF architecture (convert_hf_to_gguf.py writes mistral as llama)
    "llama": Arch("LLAMA", True),
    "mistral": Arch("LLAMA", True),
    "qwen2": Arch("QWEN2", False),
    "qwen3": Arch("QWEN3", False),
}


def import_gguf():
    try:
        import gguf
    except ImportError as e:
        raise MissingExtra(MISSING) from e
    return gguf


def check_gguf_type(gguf_type: str) -> str:
    return check_choice("--gguf-type", gguf_type, GGUF_TYPES)


def check_gguf_out(out: str | Path) -> Path:
    """OUT as a new .gguf file in an existing folder (ConfigError otherwise: nothing is overwritten)."""
    out = Path(out).expanduser()
    if out.suffix != ".gguf":
        raise ConfigError(f"--gguf {out}: give a file name ending in .gguf")
    if out.exists() or out.is_symlink():
        raise ConfigError(f"--gguf {out}: exists; give a new file name (an export never overwrites)")
    if not out.parent.is_dir():
        raise ConfigError(f"--gguf {out}: the folder {out.parent} does not exist; create it first")
    return out


def check_architecture(config) -> Arch:
    """The Arch for a transformers config, or a ConfigError naming it and the supported ones."""
    model_type = getattr(config.get_text_config(), "model_type", None) or config.model_type
    if model_type not in ARCHS:
        raise ConfigError(f"--gguf: architecture {model_type!r} is not supported; supported: {sorted(ARCHS)}")
    gguf = import_gguf()
    if not hasattr(gguf.MODEL_ARCH, ARCHS[model_type].gguf_arch):
        raise ConfigError(f"--gguf: this gguf package ({getattr(gguf, '__version__', 'old')}) has no "
                          f"{ARCHS[model_type].gguf_arch.lower()} architecture; upgrade it: pip install -U gguf")
    return ARCHS[model_type]


def check_base(cfg) -> Arch:
    """The run's base architecture (`cfg`: the run's own config), checked before the (slow) merge: reads
    only the base's config."""
    from transformers import AutoConfig

    from tinyrl.model.load import resolve_model

    import_gguf()
    resolved = resolve_model(cfg.model.name, cfg.model.gguf_file)
    kw = {"gguf_file": resolved.gguf_file} if resolved.gguf_file else {}
    return check_architecture(AutoConfig.from_pretrained(resolved.path, **kw))


def export_gguf(run_dir: str | Path, out: str | Path, cfg, gguf_type: str = "f16") -> Path:
    """Write the run's merged model to the new file `out` (see the module docstring); returns `out`.
    `cfg`: the run's own config (config.yaml), resolved once by the caller (tinyrl.api.export)."""
    from tinyrl.exporter import merged_model, run_adapter

    check_gguf_type(gguf_type)
    out = check_gguf_out(out)
    run_adapter(run_dir)
    check_base(cfg)
    model, tok, resolved = merged_model(run_dir, cfg, "float32")
    base_gguf = Path(resolved.path) / resolved.gguf_file if resolved.gguf_file else None
    name = f"{Path(cfg.model.name).name} + {Path(run_dir).resolve().name} (tinyrl)"
    return write_gguf(model, tok, out, gguf_type, name=name, base_gguf=base_gguf)


def write_gguf(model, tok, out: str | Path, gguf_type: str = "f16", name: str | None = None,
               base_gguf: Path | None = None) -> Path:
    """Write a transformers causal LM and its tokenizer to the new GGUF file `out`. `base_gguf`: the GGUF
    the model was loaded from, whose tokenizer.ggml.pre is kept."""
    from tinyrl.gguf_vocab import add_tokenizer

    gguf = import_gguf()
    check_gguf_type(gguf_type)
    out = check_gguf_out(out)
    arch = check_architecture(model.config)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, arch.gguf_arch)])
    try:
        try:
            writer.add_type(gguf.GGUFType.MODEL)
            if name:
                writer.add_name(name)
            _add_hparams(gguf, writer, model.config.get_text_config(), arch, gguf_type)
            kind = add_tokenizer(writer, tok, model.config, base_pre=_base_pre(gguf, base_gguf))
            for gguf_name, data, qtype in _tensors(gguf, model, arch, gguf_type):
                writer.add_tensor(gguf_name, data, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        _link_new(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)  # linked in (or failed): the temporary name goes
    log.info("GGUF (%s, %s tokenizer) written to %s", gguf_type, kind, out)
    return out


def _link_new(tmp: Path, out: Path) -> None:
    """Put the finished `tmp` at `out`, failing if `out` appeared meanwhile (a hard link never replaces)."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise ConfigError(f"--gguf {out}: exists; give a new file name (an export never overwrites)") from None
    except OSError as e:  # a filesystem without hard links: check, then rename
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        check_gguf_out(out)
        os.rename(tmp, out)


def _base_pre(gguf, base_gguf: Path | None) -> str | None:
    """tokenizer.ggml.pre of the GGUF the base came from (its converter recognised the pre-tokenizer)."""
    if base_gguf is None:
        return None
    field = gguf.GGUFReader(base_gguf).get_field("tokenizer.ggml.pre")
    return None if field is None else field.contents()


def _rope(config) -> dict:
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if "full_attention" in rope:  # per layer type: the full-attention layers' rope
        rope = dict(rope["full_attention"])
    rope.setdefault("rope_theta", getattr(config, "rope_theta", None))
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    if rope_type not in ("default", "linear", "yarn", "llama3"):
        raise ConfigError(f"--gguf: rope_type {rope_type!r} is not supported; supported: default, linear, yarn, llama3")
    return {**rope, "rope_type": rope_type}


def _add_hparams(gguf, w, config, arch: Arch, gguf_type: str) -> None:
    """The hyper-parameter keys convert_hf_to_gguf.py writes for these architectures (TextModel + LlamaModel)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    rope = _rope(config)
    if rope["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif rope["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope["rope_theta"] is not None:
        w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    if getattr(config, "head_dim", None) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[gguf_type])
    if arch.gguf_arch == "LLAMA":
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(head_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def permute_qk(weight, n_head: int):
    """Rows of q_proj / k_proj (or their biases) reordered for llama.cpp's rope on adjacent pairs: within
    each head, row i of the first half and row i of the second half become rows 2i and 2i+1."""
    return (weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _llama3_rope_factors(config, rope: dict):
    """The rope_freqs tensor llama.cpp applies for rope_type llama3 (Llama 3.1+: per-frequency scaling)."""
    import math

    import numpy as np

    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_ctx = rope.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _tensors(gguf, model, arch: Arch, gguf_type: str):
    """(gguf name, numpy data, GGMLQuantizationType) for each tensor of the merged model."""
    config = model.config.get_text_config()
    tmap = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.gguf_arch), config.num_hidden_layers)
    want = getattr(gguf.GGMLQuantizationType, gguf_type.upper())
    rope = _rope(config)
    if rope["rope_type"] == "llama3":
        yield "rope_freqs.weight", _llama3_rope_factors(config, rope), gguf.GGMLQuantizationType.F32
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and emb is not None and head.weight is emb.weight
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    for name, tensor in model.state_dict().items():
        if tied and name.endswith("lm_head.weight"):
            continue  # llama.cpp reads token_embd as the output when there is no output.weight
        if name.endswith("rotary_emb.inv_freq"):
            continue
        new_name = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ConfigError(f"--gguf: tensor {name!r} has no GGUF name for {arch.gguf_arch.lower()} "
                              f"(gguf.get_tensor_name_map)")
        t = tensor.detach().to("cpu").float()
        if arch.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            t = permute_qk(t, heads)
        elif arch.permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            t = permute_qk(t, kv_heads)
        data = t.numpy()
        qtype = gguf.GGMLQuantizationType.F32 if data.ndim <= 1 or new_name.endswith("_norm.weight") else want
        try:
            yield new_name, gguf.quants.quantize(data, qtype), qtype
        except gguf.QuantError:  # a row length q8_0 cannot block (not a multiple of 32): f16, like the converter
            yield new_name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.F16), gguf.GGMLQuantizationType.F16
