"""Build a memory plan for a run config: components, phase peaks, verdict, vLLM settings, maxima.

A step has three phases that never overlap in time: startup (vLLM loads while the trainer's
copy of the base is still on the card), rollout (generation: KV cache, sampling buffers) and
update (saved activations, fused loss, backward). The peak is the persistent memory (weights,
LoRA states, CUDA context) plus the largest phase, plus allocator slack on CUDA.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field, replace

from tinyrl.planner import memory as M
from tinyrl.planner.arch import resolve_arch
from tinyrl.planner.prompts import measure_prompt_tokens

log = logging.getLogger("tinyrl.planner")
SLACK = 0.10  # CUDA caching-allocator fragmentation: reserved over allocated (typical 5-15%)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def dtype_bytes(dtype: str, device: str) -> int:
    """Bytes per weight of `model.dtype`; auto is float32 on a CPU and a 16-bit type on any card."""
    return DTYPE_BYTES[dtype] if dtype != "auto" else (4 if device == "cpu" else 2)
EVAL_BATCH = 64  # tinyrl.evaluation.accuracy: held-out prompts per engine call
TYPICAL_PROMPT_TOKENS = {"gsm8k": 256, "arithmetic": 8, "reasoning_gym": 96, "jsonl": 256}


@dataclass
class Row:
    name: str
    bytes: int
    phase: str  # "always" | "startup" | "rollout" | "update"
    note: str = ""


@dataclass
class Plan:
    setup: M.Setup
    budget: int
    budget_label: str
    rows: list[Row]
    phases: dict[str, int]  # phase -> persistent + that phase (allocated bytes, before slack)
    peak_phase: str
    context: int  # CUDA context (0 on CPU)
    slack: int
    vllm: tuple[float, int] | None = None  # (gpu_memory_utilization, max_num_seqs)
    problems: list[str] = field(default_factory=list)  # reasons it cannot run whatever the peak
    notes: list[str] = field(default_factory=list)

    @property
    def allocated_peak(self) -> int:
        """Peak of tensor memory (what torch.cuda.max_memory_allocated / the RSS delta measure)."""
        return self.phases[self.peak_phase]

    @property
    def peak(self) -> int:
        return self.allocated_peak + self.slack + self.context

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget and not self.problems


def setup_from_config(cfg, device: str, world_size: int = 1, prompt_tokens: int | None = None) -> M.Setup:
    """The planner's view of a RunConfig on `device` (one rank of `world_size`)."""
    arch = resolve_arch(cfg.model.name)
    impl = cfg.algo.loss_impl
    impl = ("triton" if device == "cuda" else "torch") if impl == "auto" else impl
    return M.Setup(
        arch=arch, device=device, dtype_bytes=dtype_bytes(cfg.model.dtype, device), load_in_4bit=cfg.model.load_in_4bit,
        lora_r=cfg.lora.r, targets=M.resolve_targets(cfg.lora.target_modules, arch),
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        prompts=-(-cfg.train.prompts_per_step // world_size), generations=cfg.rollout.num_generations,
        micro_batch=cfg.train.micro_batch_size,
        prompt_tokens=prompt_tokens or TYPICAL_PROMPT_TOKENS.get(cfg.data.task, 256),
        new_tokens=cfg.rollout.max_new_tokens, engine=cfg.rollout.engine, chunk_size=cfg.algo.chunk_size,
        loss_impl=impl, eval_rows=min(EVAL_BATCH, cfg.data.num_eval) if cfg.train.eval_before_after else 0,
        quantization=cfg.model.quantization)


# --------------------------------------------------------------------------- rows


def _persistent(s: M.Setup) -> list[Row]:
    w = M.weight_bytes(s)
    shared = s.engine == "vllm" and s.device == "cuda" and s.share_weights and not s.load_in_4bit
    where = " (shared with vLLM: one copy)" if shared else ""
    kind = "nf4 + double quant" if s.load_in_4bit else \
        s.quantization if s.quantization != "none" else f"{8 * s.dtype_bytes}-bit"
    rows = [Row(f"base weights: linears ({kind}){where}", w["linears"], "always",
                "1 B a weight + an fp32 scale a row (torchao)" if s.quantization != "none" else ""),
            Row("base weights: embeddings", w["embeddings"], "always")]
    if w["lm_head"]:
        rows.append(Row("base weights: lm_head", w["lm_head"], "always"))
    rows.append(Row("base weights: norms, biases", w["norms+biases"], "always"))
    n = M.lora_params(s)
    rows.append(Row(f"LoRA r={s.lora_r}: params + grads + AdamW (fp32)", 16 * n, "always", f"{n:,} params"))
    return rows


def _update(s: M.Setup) -> list[Row]:
    mb = min(s.micro_batch, s.rows)
    gc = "with" if s.gradient_checkpointing else "without"
    loss = M.loss_bytes(s, mb)
    rows = [Row(f"activations: {mb} x {s.seq} tokens, {gc} checkpointing", M.trunk_activation_bytes(s, mb),
                "update"),
            Row(f"fused loss ({s.loss_impl}): saved rows", loss["saved"], "update"),
            Row("fused loss + backward: transient buffers",
                max(loss["forward"], loss["backward"] + M.backward_transient_bytes(s, mb)), "update",
                f"chunk {min(s.chunk_size, mb * s.new_tokens)} x vocab tile")]
    if s.load_in_4bit or s.quantization != "none":
        rows.append(Row(f"{'nf4' if s.load_in_4bit else s.quantization} dequantisation scratch (largest linear)",
                        M.dequant_scratch_bytes(s), "update"))
    return rows


def _hf_rollout(s: M.Setup, ram: int) -> list[Row]:
    train = M.hf_rollout_bytes(s, s.rows, s.generations)
    evals = M.hf_rollout_bytes(s, s.eval_rows, 1) if s.eval_rows else {}
    r = train if sum(train.values()) >= sum(evals.values()) else evals
    rows_ = s.rows if r is train else s.eval_rows
    rows = [Row(f"KV cache: {rows_} x {s.seq} tokens", r["kv_cache"], "rollout",
                f"{s.arch.kv_bytes_per_token(s.act_bytes)} B/token"),
            Row("KV cache growth (torch.cat, one layer)", r["cache_growth"], "rollout"),
            Row("prefill + sampling buffers", r["prefill"] + r["sampling"], "rollout")]
    copies = M.decode_copy_bytes(s, ram)
    if copies:
        what = "nf4 linears dequantised" if s.load_in_4bit else \
            f"{s.quantization} linears dequantised" if s.quantization != "none" else "LoRA linears merged (W + dW)"
        rows.append(Row(f"decode copies: {what}", copies, "rollout", "CPU only, within 1/8 of the RAM"))
    return rows


def _vllm(s: M.Setup, total: int, util: float, max_num_seqs: int) -> tuple[list[Row], list[str]]:
    """vLLM's rows (weights it adds, KV cache, overhead, startup) and problems that stop it starting."""
    a = s.arch
    weights = M.vllm_weight_bytes(s)
    kv_need = M.kv_cache_bytes(a, min(s.rows, max_num_seqs), s.seq, s.dtype_bytes, M.VLLM_BLOCK)
    over = M.vllm_overhead_bytes(s, max_num_seqs, total)
    share = int(util * total)
    rows, problems = [], []
    if s.load_in_4bit or not s.share_weights:
        why = "filled from the dequantised nf4 base" if s.load_in_4bit else "share_weights off"
        rows.append(Row(f"vLLM weights ({8 * s.dtype_bytes}-bit copy: {why})", weights, "always"))
    rows.append(Row("vLLM CUDA graphs + non-torch", M.VLLM_FIXED, "always"))
    rows.append(Row(f"vLLM KV cache: {min(s.rows, max_num_seqs)} seqs x {s.seq} tokens", kv_need, "rollout",
                    f"{a.kv_bytes_per_token(s.dtype_bytes)} B/token, {M.VLLM_BLOCK}-token blocks"))
    extra = share - (weights + over + kv_need)
    if extra > 0:
        rows.append(Row("vLLM KV cache: rest of its memory share", extra, "rollout",
                        f"gpu_memory_utilization {util:.2f}"))
    elif share < weights + over + M.kv_cache_bytes(a, 1, s.seq, s.dtype_bytes, M.VLLM_BLOCK):
        problems.append(f"vLLM's share ({util:.2f} x card = {share / M.GiB:.1f} GiB) is below its weights + "
                        f"overhead + one sequence's KV cache: vLLM cannot start")
    rows.append(Row("vLLM profile activations + sampler", over - M.VLLM_FIXED, "rollout"))
    held = _held_at_startup(s)
    staged = s.quantization != "none" and s.share_weights
    rows.append(Row("startup: trainer LoRA params on the card" if staged else
                    "startup: trainer base + LoRA params on the card", held, "startup",
                    f"its {s.quantization} base waits in host RAM" if staged else
                    "before vLLM's tensors back the trainer" if not s.load_in_4bit else ""))
    rows.append(Row(f"startup: vLLM's share ({util:.2f} x card)", share, "startup"))
    return rows, problems


def _held_at_startup(s: M.Setup) -> int:
    """What the trainer holds on the card while vLLM starts: its base and LoRA, or, for an int8 / fp8
    base to be shared, the LoRA only (tinyrl.rollout.vllm.stage_in_host_ram moves the base off first)."""
    lora = 4 * M.lora_params(s)
    return lora if s.quantization != "none" and s.share_weights else sum(M.weight_bytes(s).values()) + lora


def build(s: M.Setup, budget: int, budget_label: str = "", util: float | None = None,
          max_num_seqs: int | None = None) -> Plan:
    """The plan of setup `s` against `budget` bytes (vLLM settings from `vllm_settings_for` unless given)."""
    cuda = s.device == "cuda"
    rows = _persistent(s) + _update(s)
    vllm, problems = None, []
    if s.engine == "vllm" and cuda:
        if util is None or max_num_seqs is None:
            u, n = vllm_settings_for(s, budget)
            util, max_num_seqs = util or u, max_num_seqs or n
        vllm = (util, max_num_seqs)
        extra, problems = _vllm(s, budget, util, max_num_seqs)
        rows += extra
    else:
        rows += _hf_rollout(s, budget)
    always = sum(r.bytes for r in rows if r.phase == "always")
    phases = {p: always + sum(r.bytes for r in rows if r.phase == p) for p in ("rollout", "update")}
    if vllm:  # at startup: the trainer's base and LoRA, and vLLM's whole share (weights, KV, graphs)
        phases["startup"] = sum(r.bytes for r in rows if r.phase == "startup")
    peak_phase = max(phases, key=phases.get)
    slack = int(SLACK * phases[peak_phase]) if cuda else 0
    plan = Plan(s, budget, budget_label, rows, phases, peak_phase, M.CUDA_CONTEXT if cuda else 0, slack, vllm,
                problems=problems)
    plan.notes = _notes(plan)
    return plan


def _notes(p: Plan) -> list[str]:
    s, out = p.setup, []
    if s.load_in_4bit:
        w = M.weight_bytes(s)
        kept = w["embeddings"] + w["lm_head"] + w["norms+biases"]
        out.append(f"QLoRA: embeddings/lm_head/norms stay {8 * s.dtype_bytes}-bit ({kept / M.GiB:.2f} GiB; peft's "
                   f"k-bit preparation would cast them to fp32) and so do the activations")
    if s.quantization != "none":
        out.append(f"{s.quantization} (torchao weight-only): linears at 1 byte a weight + an fp32 scale a row; "
                   f"embeddings/lm_head/norms stay {8 * s.dtype_bytes}-bit"
                   + ("; vLLM quantizes the base and the trainer's linears are views of it" if s.engine == "vllm" else ""))
    if s.engine == "vllm" and s.device == "cuda" and p.phases.get("startup", 0) > p.phases["update"]:
        out.append("startup is the peak: vLLM's share loads while the trainer's int8 base waits in host RAM"
                   if s.quantization != "none" and s.share_weights else
                   "startup is the peak: the trainer's base copy and vLLM's share coexist until sharing")
    return out


# --------------------------------------------------------------------------- vLLM settings


def vllm_settings_for(s: M.Setup, gpu_bytes: int) -> tuple[float, int]:
    """(gpu_memory_utilization, max_num_seqs) that hold all B x G sequences of a rollout at once.

    vLLM's share must cover its weights, its profile activations and the KV cache of the
    rollout; it is capped so that, at startup, the share plus what the trainer already holds
    (its base, before sharing) fits on the card. When the KV cache does not fit under the
    cap, max_num_seqs drops to what does (vLLM then runs the rollout in waves)."""
    a = s.arch
    weights = M.vllm_weight_bytes(s)
    per_seq = M.kv_cache_bytes(a, 1, s.seq, s.dtype_bytes, M.VLLM_BLOCK)
    seqs = max(1, s.rows)
    need = weights + M.vllm_overhead_bytes(s, seqs, gpu_bytes) + seqs * per_seq
    held = _held_at_startup(s)  # trainer state at vLLM startup
    cap = (gpu_bytes - M.CUDA_CONTEXT - held) / gpu_bytes - 0.02
    util = min(M.round_up(need / gpu_bytes + 0.02, 0.01), round(cap, 2))
    if util * gpu_bytes < need:
        room = util * gpu_bytes - weights - M.vllm_overhead_bytes(s, seqs, gpu_bytes)
        seqs = max(1, int(room // per_seq))
    return max(0.05, round(util, 2)), seqs


def vllm_settings(cfg, gpu_bytes: int, prompt_tokens: int | None = None) -> tuple[float, int]:
    """(gpu_memory_utilization, max_num_seqs) for this run's colocated vLLM on a card of `gpu_bytes`.

    A `rollout.gpu_memory_utilization` set away from its default is kept (the user chose it) and
    only max_num_seqs is fitted to it; the prompt length is measured on the run's own prompts
    where they and the tokenizer are on disk."""
    if prompt_tokens is None:
        found = measure_prompt_tokens(cfg)
        prompt_tokens = found[0] if found else None
    try:
        s = setup_from_config(cfg, "cuda", prompt_tokens=prompt_tokens)
    except ValueError as e:  # an architecture the planner cannot read: keep the config's share
        log.warning("memory plan unavailable (%s): vLLM keeps rollout.gpu_memory_utilization=%.2f", e,
                    cfg.rollout.gpu_memory_utilization)
        return cfg.rollout.gpu_memory_utilization, max(1, cfg.train.prompts_per_step * cfg.rollout.num_generations)
    util, seqs = vllm_settings_for(s, gpu_bytes)
    log.info("memory plan: vLLM gpu_memory_utilization=%.2f, max_num_seqs=%d (%d prompt + %d new tokens)",
             util, seqs, s.prompt_tokens, s.new_tokens)
    chosen = cfg.rollout.gpu_memory_utilization
    if chosen != _default_util(cfg):
        a = s.arch
        per_seq = M.kv_cache_bytes(a, 1, s.seq, s.dtype_bytes, M.VLLM_BLOCK)
        room = chosen * gpu_bytes - M.vllm_weight_bytes(s) - M.vllm_overhead_bytes(s, s.rows, gpu_bytes)
        util, seqs = chosen, max(1, min(s.rows, int(room // per_seq)))
    return util, seqs


def _default_util(cfg) -> float:
    field_ = next(f for f in dataclasses.fields(type(cfg.rollout)) if f.name == "gpu_memory_utilization")
    return field_.default


# --------------------------------------------------------------------------- what fits


def largest(s: M.Setup, budget: int, knob: str, hi: int | None = None) -> int | None:
    """The largest value of `knob` (micro_batch | generations | prompts | new_tokens) whose plan fits, or None."""
    def fits(v: int) -> bool:
        t = replace(s, **{knob: v})
        if knob == "micro_batch" and t.rows % v:
            return False
        return build(t, budget).fits

    if knob == "micro_batch":  # the divisors of the rows, found up to their square root
        small = [v for v in range(1, math.isqrt(s.rows) + 1) if s.rows % v == 0]
        ok = [v for v in sorted(set(small + [s.rows // v for v in small])) if fits(v)]
        return max(ok) if ok else None
    if knob in ("generations", "prompts"):  # the rows (prompts x generations) must split into micro-batches:
        other = s.prompts if knob == "generations" else s.generations  # the multiples of q do
        q = s.micro_batch // math.gcd(other, s.micro_batch)
        first, top = (2, hi or 256) if knob == "generations" else (1, hi or s.prompts)
        lo, hi_, best = -(-first // q), top // q, None  # multiples q*j, j in [lo, hi_]
        while lo <= hi_:  # plans grow with G (and B): the last fitting one, by bisection
            mid = (lo + hi_) // 2
            if fits(q * mid):
                best, lo = q * mid, mid + 1
            else:
                hi_ = mid - 1
        return best
    top = hi or max(1, (s.arch.max_positions or 32768) - s.prompt_tokens)
    lo, hi_ = 0, top
    while lo < hi_:
        mid = (lo + hi_ + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi_ = mid - 1
    return lo or None


def plan_config(cfg, device: str, budget: int, budget_label: str = "", world_size: int = 1,
                prompt_tokens: int | None = None) -> Plan:
    """The plan of a RunConfig; a rollout.gpu_memory_utilization set away from its default is planned as given.
    model.gradient_checkpointing auto is planned as the rule decides it for this budget (a note says why)."""
    why = None
    if cfg.model.gradient_checkpointing == "auto":
        cfg, why = decide(cfg, device, budget, world_size, prompt_tokens)
    s = setup_from_config(cfg, device, world_size, prompt_tokens)
    util = cfg.rollout.gpu_memory_utilization
    if util == _default_util(cfg):
        plan = build(s, budget, budget_label)
    else:
        plan = build(s, budget, budget_label, util=util, max_num_seqs=s.rows)
    if why:
        plan.notes.append(why)
    return plan


# --------------------------------------------------------------------------- gradient checkpointing "auto"
# The rule tinyrl/planner/checkpointing.py describes (and applies where a trainer starts). It lives
# here, beside plan_config, because it is a question to the plan and plan_config plans "auto" with it.


def with_checkpointing(cfg, on: bool):
    """`cfg` with model.gradient_checkpointing set to `on`."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gradient_checkpointing=on))


def checkpointing_pays(cfg, device: str, budget: int, world_size: int = 1,
                       prompt_tokens: int | None = None) -> tuple[bool, str]:
    """The rule for RunConfig `cfg` on `device` with `budget` bytes: (on, why).

    On exactly when the plan without checkpointing does not fit and its peak is the update phase."""
    plan = plan_config(with_checkpointing(cfg, False), device, budget, world_size=world_size,
                       prompt_tokens=prompt_tokens)
    of = f"{M.size(plan.peak)} of {M.size(budget)}"
    if plan.fits:
        return False, f"the run fits without it (planned peak {of})"
    if plan.peak_phase != "update":
        return False, f"the planned peak ({of}) is the {plan.peak_phase} phase, which checkpointing does not lower"
    return True, f"without it the update's planned peak is {of}"


def decide(cfg, device: str, budget: int, world_size: int = 1, prompt_tokens: int | None = None):
    """(`cfg` with "auto" decided by the rule, the line that says what and why)."""
    on, why = checkpointing_pays(cfg, device, budget, world_size, prompt_tokens)
    return with_checkpointing(cfg, on), checkpointing_line(on, why)


def checkpointing_line(on: bool, why: str) -> str:
    return f"model.gradient_checkpointing auto -> {str(on).lower()}: {why}"
