"""Bytes per component of a GRPO step, derived from the architecture and the code tinyrl runs.

Every function here is integer arithmetic on an `Arch` and a `Setup`, and each formula names
the code whose allocations it counts:

- weights: bf16/fp16/fp32 tensors, or bitsandbytes nf4 with double quantisation (4-bit
  codes, one uint8 absmax per 64 weights, one fp32 absmax per 256 of those), or torchao int8 /
  fp8 weight-only (`model.quantization`: one byte a weight, one fp32 scale an output row; with
  the vllm engine one copy, vLLM's, that the trainer's linears are views of). The other
  parameters (embeddings, lm_head, norms, biases) stay in model.dtype under QLoRA too
  (tinyrl.model.load.prepare_for_training; peft's own preparation would cast them to fp32),
  and so do the residual stream, every activation and the HF engine's KV cache.
- LoRA: peft keeps adapters in fp32 (`autocast_adapter_dtype`): parameter, gradient and
  AdamW's two moments are 16 bytes per adapter weight.
- activations: the tensors autograd saves in transformers' Llama/Qwen2 decoder with sdpa
  attention, frozen base and LoRA on `targets` (`saved_per_token_layer`, checked tensor by
  tensor against `torch.autograd.graph.saved_tensors_hooks` in tests/test_plan.py).
- the fused loss (`tinyrl/kernels/torch_logprobs.py`, `tinyrl/kernels/triton_logprobs.py`): logits exist
  only as [chunk, vocab tile] fp32 blocks; the backward holds an fp32 grad of the selected
  hidden rows.
- KV cache: 2 x layers x kv_heads x head_dim x bytes per token (vLLM's
  `AttentionSpec.page_size_bytes` per layer, in 16-token blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tinyrl.planner.arch import LINEAR_NAMES, Arch

MiB = 2**20
GiB = 2**30
NF4_BLOCK = 64  # bitsandbytes 4-bit block size (Params4bit default on CUDA and CPU)
NF4_BLOCK2 = 256  # blocks of the double-quantised absmax
VLLM_BLOCK = 16  # vLLM KV-cache block (tokens)
VOCAB_TILE = 8192  # tinyrl/kernels/torch_logprobs.py VOCAB_TILE
TRITON_ROW_CHUNK, TRITON_VOCAB_CHUNK = 4096, 8192  # tinyrl/kernels/triton_logprobs.py backward block
CUDA_CONTEXT = 500 * MiB  # driver context + cuBLAS/cuDNN workspaces, outside torch's allocator (typical)
VLLM_FIXED = 512 * MiB  # vLLM's CUDA graphs and non-torch memory (an estimate; not measured here)
SAMPLING_COPIES = 4  # HF generate, per step: fp32 logits, the logprob recorder, temperature-scaled, softmax


def size(n: int) -> str:
    """Bytes as a reader wants them: GiB, or MiB below 1 GiB (a tiny run is not "0.00 GiB").

    >>> size(5 * GiB + GiB // 2), size(28 * MiB + MiB // 2), size(0)
    ('5.50 GiB', '28.5 MiB', '0.0 MiB')
    """
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


@dataclass(frozen=True)
class Setup:
    """What the memory of one run depends on (one rank: its share of the prompts)."""

    arch: Arch
    device: str  # "cuda" | "cpu"
    dtype_bytes: int  # model.dtype
    load_in_4bit: bool
    lora_r: int
    targets: tuple[str, ...]  # adapted modules among LINEAR_NAMES (+ "lm_head")
    gradient_checkpointing: bool
    prompts: int  # B
    generations: int  # G
    micro_batch: int  # completions per forward/backward
    prompt_tokens: int  # P (padded)
    new_tokens: int  # C (max_new_tokens: the worst case, every completion runs to the cap)
    engine: str  # "hf" | "vllm"
    chunk_size: int = 1024
    loss_impl: str = "torch"  # "torch" | "triton" (auto resolved by the caller)
    share_weights: bool = True  # vLLM: the trainer's frozen base is a view of vLLM's
    eval_rows: int = 64  # evaluate.accuracy batch
    quantization: str = "none"  # model.quantization: none | int8 | fp8 (torchao weight-only)

    @property
    def rows(self) -> int:
        return self.prompts * self.generations

    @property
    def seq(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def act_bytes(self) -> int:
        """Dtype of the residual stream: model.dtype, 4-bit base or not."""
        return self.dtype_bytes


def resolve_targets(target_modules, arch: Arch) -> tuple[str, ...]:
    """peft's target_modules -> the adapted module kinds ("all-linear": every linear but lm_head)."""
    if isinstance(target_modules, str):
        if target_modules == "all-linear":
            return LINEAR_NAMES
        target_modules = [target_modules]
    names = {str(t).rsplit(".", 1)[-1] for t in target_modules}
    return tuple(n for n in (*LINEAR_NAMES, "lm_head") if n in names)


# --------------------------------------------------------------------------- weights


def nf4_bytes(numel: int, blocksize: int = NF4_BLOCK, double_quant: bool = True) -> int:
    """Bytes of one bitsandbytes nf4 weight: packed 4-bit codes + absmax (+ its quantisation).

    Double quant stores each block's absmax as uint8 with one fp32 scale per 256 blocks, plus a
    256-entry fp32 code book, the 16-entry nf4 code and one fp32 offset per weight.

    >>> nf4_bytes(4864 * 896)  # Qwen2.5-0.5B gate_proj: 2179072 + 68096 + 4 * 266 + 1024 + 64 + 4
    2249324
    """
    blocks = -(-numel // blocksize)
    if not double_quant:
        return -(-numel // 2) + 4 * blocks + 16 * 4
    return -(-numel // 2) + blocks + 4 * -(-blocks // NF4_BLOCK2) + 256 * 4 + 16 * 4 + 4


def rowwise_8bit_bytes(fan_in: int, fan_out: int) -> int:
    """Bytes of one torchao int8 / fp8 weight-only linear: one byte a weight + one fp32 scale a row
    (`Int8Tensor` / `Float8Tensor`, PerRow; the scales stay fp32 under a bf16 model too).

    >>> rowwise_8bit_bytes(896, 4864)  # Qwen2.5-0.5B gate_proj: 4358144 + 4 * 4864
    4377600
    """
    return fan_in * fan_out + 4 * fan_out


def vllm_weight_bytes(s: Setup) -> int:
    """What vLLM holds of the base: the model dtype, or the int8 / fp8 linears (+ 16-bit rest) when
    model.quantization quantizes it at load (its torchao method)."""
    if s.quantization != "none":
        return sum(weight_bytes(s).values())
    return s.arch.num_params * s.dtype_bytes


def weight_bytes(s: Setup) -> dict[str, int]:
    """Trainer base weights by part. QLoRA: 4-bit linears; int8 / fp8: 1-byte linears; everything else
    in model.dtype."""
    a = s.arch
    other = s.dtype_bytes
    if s.load_in_4bit:
        linears = a.num_layers * sum(nf4_bytes(i * o) for i, o, _ in a.linears().values())
    elif s.quantization != "none":
        linears = a.num_layers * sum(rowwise_8bit_bytes(i, o) for i, o, _ in a.linears().values())
    else:
        linears = a.linear_weight_params * s.dtype_bytes
    return {"linears": linears, "embeddings": a.embedding_params * other, "lm_head": a.lm_head_params * other,
            "norms+biases": a.small_params * other}


def lora_params(s: Setup) -> int:
    a, r = s.arch, s.lora_r
    n = a.num_layers * sum(r * (i + o) for name, (i, o, _) in a.linears().items() if name in s.targets)
    return n + (r * (a.hidden_size + a.vocab_size) if "lm_head" in s.targets else 0)


# --------------------------------------------------------------------------- activations


def saved_per_token_layer(s: Setup) -> int:
    """Bytes autograd saves per token in one decoder layer (frozen base, fp32 LoRA on s.targets).

    Frozen linears save nothing (their weight grad is not needed); a LoRA'd linear saves its
    input as lora_A sees it: shared with other modules reading the same tensor when the
    activations are fp32, one fp32 copy per module otherwise (peft casts x to the adapter's
    dtype). RMSNorm saves its fp32 input; sdpa saves q, k, v (repeated to all heads under GQA
    with a padding mask, as transformers does), the output and an fp32 logsumexp; the SwiGLU
    MLP saves gate, silu(gate) and up.
    """
    a, d, t = s.arch, s.act_bytes, set(s.targets)
    q_w = a.num_heads * a.head_dim
    out = 2 * (4 * a.hidden_size + 4)  # two RMSNorms: fp32 input + rsqrt
    out += 4 * q_w * d + 4 * a.num_heads  # sdpa: q, k_rep, v_rep, out (+ lse)
    out += 3 * a.intermediate_size * d  # gate, silu(gate), up

    def lora_inputs(names: tuple[str, ...], width: int) -> int:
        n = sum(1 for m in names if m in t)
        if n == 0:
            return 0
        return width * d if d == 4 else n * width * 4

    out += lora_inputs(("q_proj", "k_proj", "v_proj"), a.hidden_size)
    out += lora_inputs(("o_proj",), q_w)
    out += lora_inputs(("gate_proj", "up_proj"), a.hidden_size)
    out += lora_inputs(("down_proj",), a.intermediate_size)
    out += 4 * s.lora_r * sum(1 for m in LINEAR_NAMES if m in t)  # lora_A outputs
    return out


def forward_saved_bytes(s: Setup, rows: int) -> int:
    """What autograd holds after the forward of one micro-batch of `rows` sequences through the decoder
    stack (the update's `completion_hidden`): every layer's saved tensors, or with gradient
    checkpointing only each layer's input. Measured tensor by tensor in tests/test_plan.py."""
    a, d, S = s.arch, s.act_bytes, s.seq
    tokens = rows * S
    final_norm = tokens * (4 * a.hidden_size + 4)
    if s.gradient_checkpointing:  # layer inputs only; backward recomputes one layer at a time
        return a.num_layers * tokens * a.hidden_size * d + final_norm
    first = tokens * (4 * a.hidden_size + 4)  # layer 0's input needs no grad: its norm saves nothing
    return a.num_layers * saved_per_token_layer(s) * tokens - first + final_norm


def recompute_bytes(s: Setup, rows: int) -> int:
    """Gradient checkpointing: one layer's saved tensors, rebuilt during its backward (0 without)."""
    return saved_per_token_layer(s) * rows * s.seq if s.gradient_checkpointing else 0


def shared_bytes(s: Setup, rows: int) -> int:
    """The [rows, 1, S, S] attention mask and rope's cos/sin that every layer reads (one copy)."""
    a, d, S = s.arch, s.act_bytes, s.seq
    return rows * S * S * d + 2 * rows * S * a.head_dim * d


def trunk_activation_bytes(s: Setup, rows: int) -> int:
    """Activation memory of one micro-batch at its peak in the update: the forward's saved tensors,
    the recomputed layer (checkpointing), and the mask + rope tables they share."""
    return forward_saved_bytes(s, rows) + recompute_bytes(s, rows) + shared_bytes(s, rows)


def backward_transient_bytes(s: Setup, rows: int) -> int:
    """Gradient buffers alive while the last layer's backward runs: two [tokens, I] MLP grads (the
    fp32 grad of down_proj's LoRA input copy when activations are 16-bit) and a residual grad.
    Measured on CPU (live RSS, tiny-arith's shape, fp32): 4160 B/token against 4608 from this."""
    a, d, tokens = s.arch, s.act_bytes, rows * s.seq
    lora_copy = 4 * a.intermediate_size if ("down_proj" in s.targets and d != 4) else 0
    return tokens * (2 * a.intermediate_size * d + lora_copy + 4 * a.hidden_size)


def loss_bytes(s: Setup, rows: int) -> dict[str, int]:
    """The fused linear loss for one micro-batch: saved inputs, forward blocks, backward buffers.

    Logits are never materialised: the torch path keeps [chunk, 8192] fp32 blocks (z and exp z),
    the Triton path keeps them in registers and writes one [4096, 8192] dz buffer in the hidden
    dtype for the backward. Both hold an fp32 grad of the selected hidden rows."""
    a, d = s.arch, s.act_bytes
    n = rows * s.new_tokens  # rows in the loss (worst case: every completion token)
    H, V = a.hidden_size, a.vocab_size
    saved = n * (H * d + 4 + 8)  # selected hidden rows (a copy), lse, targets
    head = 0
    if "lm_head" in s.targets:  # output_projection folds the head adapter: a fresh [V, H] weight + fp32 grad
        head = V * H * (d + 4)
    chunk, tile = min(s.chunk_size, n), min(VOCAB_TILE, V)
    if s.loss_impl == "triton":
        fwd = 16 * n * max(1, -(-V // (128 * 64)))  # split partials (4 x splits x M fp32): tiny
        block = min(n, TRITON_ROW_CHUNK) * min(V, TRITON_VOCAB_CHUNK) * d + min(n, TRITON_ROW_CHUNK) * H * d
    else:
        fwd = chunk * tile * (8 + (d if d != 4 else 0))  # z (fp32) + exp(z) (+ the matmul's own output)
        block = chunk * tile * (4 + (d if d != 4 else 0)) + (tile * H * 4 if s.dtype_bytes != 4 else 0)
    bwd = n * H * (4 + d) + block + rows * s.seq * H * d  # fp32 grad + its cast, dz block, full-sequence grad
    return {"saved": saved + head, "forward": fwd, "backward": bwd}


def dequant_scratch_bytes(s: Setup) -> int:
    """QLoRA (and int8 / fp8, counted alike: torchao's weight-only matmul may dequantise): the largest
    linear dequantised to the compute dtype (forward, and again in backward)."""
    if not s.load_in_4bit and s.quantization == "none":
        return 0
    return max(i * o for i, o, _ in s.arch.linears().values()) * s.dtype_bytes


# --------------------------------------------------------------------------- rollout


def kv_cache_bytes(arch: Arch, sequences: int, tokens: int, dtype_bytes: int, block: int = 1) -> int:
    """KV cache for `sequences` of `tokens` each: 2 x layers x kv_heads x head_dim x bytes x tokens.

    `block` rounds each sequence up to whole blocks (vLLM: 16 tokens).

    >>> from tinyrl.planner.arch import ARCHITECTURES
    >>> kv_cache_bytes(ARCHITECTURES["qwen2.5-0.5b-instruct"], 64, 512, 2) // 2**20  # 12 KiB/token
    384
    """
    per_seq = -(-tokens // block) * block
    return sequences * per_seq * arch.kv_bytes_per_token(dtype_bytes)


def hf_rollout_bytes(s: Setup, rows: int, n: int) -> dict[str, int]:
    """tinyrl.rollout.hf: KV cache of `rows` completions (prompts prefilled once, repeated n times),
    the DynamicCache's per-step concatenation (one layer twice), prefill temporaries, sampling."""
    a, d = s.arch, s.act_bytes
    kv = kv_cache_bytes(a, rows, s.seq, d)
    one_layer = kv // a.num_layers
    prompts = max(1, rows // n)
    prefill_tokens = prompts * s.prompt_tokens
    prefill = prefill_tokens * (3 * a.intermediate_size + 4 * a.hidden_size) * d \
        + prompts * s.prompt_tokens ** 2 * d
    sampling = rows * a.vocab_size * (4 * SAMPLING_COPIES + d)
    return {"kv_cache": kv, "cache_growth": one_layer, "prefill": prefill, "sampling": sampling}


def decode_copy_bytes(s: Setup, ram: int) -> int:
    """The HF engine's decode copies on a CPU (`tinyrl.model.merged_lora_linears`): each LoRA-adapted
    float linear as W + dW, and under QLoRA every 4-bit linear dequantised (+ dW), in the activation
    dtype, within an eighth of the RAM (`ram`); none on a GPU.

    >>> from tinyrl.planner.arch import ARCHITECTURES
    >>> a = ARCHITECTURES["qwen2.5-0.5b-instruct"]
    >>> s = Setup(a, "cpu", 4, True, 8, ("q_proj",), False, 1, 1, 1, 8, 8, "hf")
    >>> decode_copy_bytes(s, 2 ** 40) == a.linear_weight_params * 4, decode_copy_bytes(s, 8 * 2 ** 20)
    (True, 1048576)
    """
    # lazy: tinyrl.model is the loader (torch, transformers); `import tinyrl.planner` stays arithmetic
    from tinyrl.model import MERGE_SHARE

    if s.device != "cpu":
        return 0
    a = s.arch
    if s.load_in_4bit or s.quantization != "none":  # every quantized linear dequantised (+ dW)
        copied = a.linear_weight_params
    else:
        copied = a.num_layers * sum(i * o for name, (i, o, _) in a.linears().items() if name in s.targets)
    return min(copied * s.act_bytes, ram // MERGE_SHARE)


def vllm_overhead_bytes(s: Setup, max_num_seqs: int, total: int) -> int:
    """vLLM's non-KV, non-weight memory: its profile run's activations (max_num_batched_tokens of
    prefill, default 8192 or 16384 on >= 70 GiB cards), the sampler's [max_num_seqs, V] fp32
    buffers, CUDA graphs and non-torch memory (vllm/engine/arg_utils.py get_batch_defaults)."""
    a = s.arch
    tokens = 16384 if total >= 70 * GiB else 8192
    act = tokens * (3 * a.intermediate_size + 3 * a.hidden_size) * s.dtype_bytes
    sampler = max_num_seqs * a.vocab_size * 4 * 3
    return act + sampler + VLLM_FIXED


def round_up(x: float, step: float) -> float:
    return math.ceil(x / step - 1e-9) * step
