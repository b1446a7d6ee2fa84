"""Model architectures for the memory planner: the few config.json numbers memory depends on.

`resolve_arch(name)` reads a model's config.json when there is one (a local folder, a shipped
model via `tinyrl.model.resolve_model`, or a hub id already in the local Hugging Face cache),
and otherwise looks the name up in `ARCHITECTURES`, an offline table of common models whose
values are copied from their published config.json files (sources beside each entry).
Everything here is arithmetic on integers: nothing is downloaded, no weights are read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """A decoder-only Llama/Qwen2-style transformer (RMSNorm, RoPE, GQA, SwiGLU MLP)."""

    name: str
    hidden_size: int  # H
    num_layers: int  # L
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # I
    vocab_size: int  # V
    tie_word_embeddings: bool
    qkv_bias: bool = False  # Qwen2: biases on q/k/v (not o)
    max_positions: int = 32768  # the context (max_position_embeddings); 0: its config.json does not say
    source: str = ""  # where the numbers came from
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def linears(self) -> dict[str, tuple[int, int, bool]]:
        """Per decoder layer: module name -> (in_features, out_features, has_bias)."""
        H, I, q, kv = self.hidden_size, self.intermediate_size, self.num_heads * self.head_dim, \
            self.num_kv_heads * self.head_dim
        b = self.qkv_bias
        return {"q_proj": (H, q, b), "k_proj": (H, kv, b), "v_proj": (H, kv, b), "o_proj": (q, H, False),
                "gate_proj": (H, I, False), "up_proj": (H, I, False), "down_proj": (I, H, False)}

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Extra parameters of the output projection (0 when tied to the embeddings)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def linear_weight_params(self) -> int:
        """Weights of every decoder-layer linear (the modules 4-bit quantisation packs)."""
        return self.num_layers * sum(i * o for i, o, _ in self.linears().values())

    @property
    def small_params(self) -> int:
        """Norm weights (2 per layer + the final one) and linear biases."""
        biases = sum(o for _, o, b in self.linears().values() if b)
        return self.num_layers * (2 * self.hidden_size + biases) + self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameter count.

        >>> ARCHITECTURES["qwen2.5-0.5b-instruct"].num_params
        494032768
        """
        return self.embedding_params + self.lm_head_params + self.linear_weight_params + self.small_params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x bytes.

        >>> ARCHITECTURES["llama-3.1-8b-instruct"].kv_bytes_per_token(2)  # 128 KiB
        131072
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def from_config(cfg: dict, name: str = "", source: str = "") -> Arch:
    """An `Arch` from a parsed config.json (Llama, Qwen2, Mistral and other Llama-shaped models)."""
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise ValueError(f"config.json of {name or 'the model'} lacks {missing}: the planner needs a "
                         f"Llama/Qwen2-style decoder")
    heads = cfg["num_attention_heads"]
    return Arch(
        name=name or cfg.get("_name_or_path", "") or cfg.get("model_type", "model"),
        hidden_size=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        max_positions=cfg.get("max_position_embeddings") or 0, source=source)


def _qwen(name, H, L, nh, kv, I, V, tied, src):
    return Arch(name, H, L, nh, kv, H // nh, I, V, tied, qkv_bias=True, max_positions=32768, source=src,
                aliases=(f"qwen/{name}",))


def _llama(name, H, L, nh, kv, hd, I, tied, src):
    return Arch(name, H, L, nh, kv, hd, I, 128256, tied, max_positions=131072, source=src,
                aliases=(f"meta-llama/{name}", name.removesuffix("-instruct")))


def _smol(name, H, L, nh, kv, I, src):
    return Arch(name, H, L, nh, kv, H // nh, I, 49152, True, max_positions=8192, source=src,
                aliases=(f"huggingfacetb/{name}", name.removesuffix("-instruct")))


# Values from each model's published config.json on the Hugging Face hub, cross-checked with:
#   Qwen2.5:   pytorch/torchtune torchtune/models/qwen2_5/_model_builders.py (qwen2_5_0_5b,
#              qwen2_5_1_5b_instruct, qwen2_5_3b, qwen2_5_7b_instruct: vocab 151936 / 152064,
#              layers, heads, kv heads, embed_dim, intermediate_dim, 32768 positions, tied up to 3B),
#              and citsjtu2020/LLM-Prof sglang/Model_Config.md (the Qwen2.5-3B and 7B config.json).
#   Llama 3.x: kevinstephano/thunder_model_blocks hf_llama/llama_config.py (Llama-3.2-1B-Instruct
#              config.json, head_dim 64) and citsjtu2020/LLM-Prof sglang/Model_Config.md
#              (Llama-3.2-3B, Llama-3.1-8B config.json).
#   SmolLM2:   pytorch/torchtune torchtune/models/smol/_model_builders.py (smollm2(layers, heads,
#              kv heads, embed, intermediate) for 135M / 360M / 1.7B) and the SmolLM2-135M
#              config.json printed in satyasundar/erav3-s13 README.md (vocab 49152, tied).
_TABLE = [
    _qwen("qwen2.5-0.5b-instruct", 896, 24, 14, 2, 4864, 151936, True, "Qwen/Qwen2.5-0.5B-Instruct config.json"),
    _qwen("qwen2.5-1.5b-instruct", 1536, 28, 12, 2, 8960, 151936, True, "Qwen/Qwen2.5-1.5B-Instruct config.json"),
    _qwen("qwen2.5-coder-1.5b-instruct", 1536, 28, 12, 2, 8960, 151936, True,  # Qwen2.5-1.5B's shapes (model card)
          "Qwen/Qwen2.5-Coder-1.5B-Instruct config.json"),
    _qwen("qwen2.5-3b-instruct", 2048, 36, 16, 2, 11008, 151936, True, "Qwen/Qwen2.5-3B-Instruct config.json"),
    _qwen("qwen2.5-7b-instruct", 3584, 28, 28, 4, 18944, 152064, False, "Qwen/Qwen2.5-7B-Instruct config.json"),
    _llama("llama-3.2-1b-instruct", 2048, 16, 32, 8, 64, 8192, True, "meta-llama/Llama-3.2-1B config.json"),
    _llama("llama-3.2-3b-instruct", 3072, 28, 24, 8, 128, 8192, True, "meta-llama/Llama-3.2-3B config.json"),
    _llama("llama-3.1-8b-instruct", 4096, 32, 32, 8, 128, 14336, False, "meta-llama/Llama-3.1-8B config.json"),
    _smol("smollm2-135m-instruct", 576, 30, 9, 3, 1536, "HuggingFaceTB/SmolLM2-135M config.json"),
    _smol("smollm2-360m-instruct", 960, 32, 15, 5, 2560, "HuggingFaceTB/SmolLM2-360M config.json"),
    _smol("smollm2-1.7b-instruct", 2048, 24, 32, 32, 8192, "HuggingFaceTB/SmolLM2-1.7B config.json"),
]
ARCHITECTURES: dict[str, Arch] = {a.name: a for a in _TABLE}
_BY_ALIAS: dict[str, Arch] = {k: a for a in _TABLE for k in (a.name, *a.aliases)}
# the Qwen2.5 base models share the instruct models' shapes (0.5B-3B exactly; 7B too, bar 131072 positions)
_BY_ALIAS.update({k.removesuffix("-instruct"): a for k, a in list(_BY_ALIAS.items()) if k.startswith(("qwen", "Qwen"))})


def lookup(name: str) -> Arch | None:
    """The offline table entry for a short name or hub id (case-insensitive), or None."""
    return _BY_ALIAS.get(name.strip().lower())


def _config_json_for(name: str) -> Path | None:
    """config.json of a shipped model, a local folder, or a hub id in the local HF cache."""
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    try:  # lazy: tinyrl.model is the loader (torch, transformers); `import tinyrl.planner` stays arithmetic
        from tinyrl.model import BUILTIN_MODELS, resolve_model

        if name in BUILTIN_MODELS:
            resolved = resolve_model(name)
            cfg = Path(resolved.path) / "config.json"
            return cfg if cfg.is_file() and not resolved.gguf_file else None
    except Exception:  # noqa: BLE001  (a missing optional package: fall through to the table)
        return None
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(name, "config.json")
            return Path(hit) if isinstance(hit, str) else None
        except Exception:  # noqa: BLE001
            return None
    return None


def resolve_arch(name: str) -> Arch:
    """The architecture of `name`: its real config.json where one is on disk, else the offline table."""
    cfg = _config_json_for(name)
    if cfg is not None:
        return from_config(json.loads(cfg.read_text()), name=name, source=str(cfg))
    hit = lookup(name)
    if hit is not None:
        return replace(hit, source=f"offline table: {hit.source}")
    raise ValueError(f"model.name {name!r}: no config.json on disk (local folder, shipped model or HF cache) "
                     f"and not in the planner's offline table {sorted(ARCHITECTURES)}; "
                     f"pass a local folder with a config.json")
