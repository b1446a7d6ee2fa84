"""The vLLM server rollout engine (`rollout.engine: vllm_server`): rollouts from vLLM OpenAI-compatible servers on
devices (or machines) of their own, fed adapter versions only. The trainer's process imports no vLLM.

    tinyrl serve PRESET --devices 4,5,6,7      # one `vllm serve BASE --enable-lora ...` per device (tinyrl/serve.py)
    tinyrl train PRESET rollout.engine=vllm_server rollout.server_url=[http://127.0.0.1:8000,...]

- Adapter-only sync: `sync(model)` marks the policy; before the next request the adapter is saved (a few MB: the
  LoRA tensors only) to a folder the servers read (`rollout.server_adapter_dir`, default /dev/shm on this
  machine) and loaded on every server as a new version (`POST /v1/load_lora_adapter`: runtime LoRA updating,
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True on the server); requests name that version; the previous one is unloaded
  (`/v1/unload_lora_adapter`). With one-step-off (`bound_to`) the rollout copy's adapter is uploaded as a version
  of its own when a collection starts, so the trainer's own engine uploads only when it evaluates.
- Exact ids and behaviour logprobs: prompts go as token ids; `return_tokens_as_token_ids` returns each sampled
  token as "token_id:N" and `logprobs: 0` its logprob (with `--logprobs-mode processed_logprobs` on the server:
  after temperature and top-p, what the trainer scores; `tinyrl serve` sets it), so the off-policy correction
  and the stale-weights canary work as with the colocated engine. A stop string is cut from the text, never from
  the ids. Sampling parameters are all sent (none left to the model's generation_config).
- Seeds: one request per sample, seeded as the colocated vLLM engine's session seeds them (a prompt's stream,
  `SamplingParams.stream`, or the call's base seed), so a prompt draws the same samples in any batch or rank.
- Sessions (`session`: partial rollouts, streaming agent episodes) are a `QueueSession` over concurrent streamed
  requests: `submit` starts one on a worker thread, `poll` waits for the next tokens of any of them, `abort`
  closes their connections (vLLM aborts a request whose client went away) and keeps the tokens polled so far.
- Failures (tinyrl/rollout/server_client.py): no server at start is an error before the first step; a failing
  request is retried with back-off for rollout.server_retry_s; a restarted server gets the current version again.
- N processes: each rank sends to its share of the servers (`rank_servers`: every server the same load) and
  uploads its own (identical) adapter there under names of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import queue
import secrets
import shutil
import socket
import tempfile
import threading
import time
import weakref
from pathlib import Path

import torch

from tinyrl.rollout.base import Sample, SamplingParams, stream_seed
from tinyrl.rollout.engine import SamplingEngine
from tinyrl.rollout.server_client import Cancelled, RolloutServerError, ServerPool
from tinyrl.rollout.session import QueueSession

log = logging.getLogger("tinyrl.rollout.vllm_server")

POLL_S = 1.0  # the longest `poll` waits for news (a session's caller checks its stop rule at least this often)
ADAPTER_HINT = ("the server needs --enable-lora, --max-lora-rank >= lora.r, --max-loras >= 2 and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment (`tinyrl serve PRESET` sets them)")


def rank_servers(urls: list[str], rank: int, world: int) -> list[str]:
    """The servers rank `rank` of `world` sends to, so that every server carries the same load: every world-th
    from its own (servers a multiple of the ranks), one server shared by world / servers ranks (ranks a multiple
    of the servers), else all of them (balanced by requests in flight; each rank's adapter then goes to every
    server: `tinyrl serve` gives each server LoRA slots for every rank).

    >>> rank_servers(["a", "b", "c", "d"], 1, 2), rank_servers(["a", "b"], 3, 4), rank_servers(["a", "b", "c"], 4, 5)
    (['b', 'd'], ['b'], ['a', 'b', 'c'])
    """
    if len(urls) % world == 0:
        return urls[rank::world]
    return [urls[rank % len(urls)]] if world % len(urls) == 0 else list(urls)


class ServerEngine(SamplingEngine):
    """Sample from vLLM servers; the policy's LoRA adapter reaches them as a new version after it moved."""

    def __init__(self, pool: ServerPool, tokenizer, seed: int = 0, model=None, adapter_dir: str | None = None,
                 workers: int = 512):
        self.pool, self.tokenizer, self.seed, self._model = pool, tokenizer, seed, model
        self.calls = 0  # sampling seed position; saved in checkpoints
        self.sync_times: list[float] = []  # seconds per adapter upload
        self.tag = f"tinyrl-{os.getpid()}-{secrets.token_hex(3)}"  # this engine's version names (ranks, copies: apart)
        self.version: tuple[str, str] | None = None  # (name, folder) of the adapter the requests name
        self._versions, self._synced = itertools.count(1), None
        shm = Path("/dev/shm")
        root = adapter_dir or (str(shm) if os.access(shm, os.W_OK) else None)
        if root is not None:
            Path(root).mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix="tinyrl-server-lora-", dir=root))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._dir), True)
        self._slots = threading.BoundedSemaphore(workers)  # requests on the wire at once
        self._events: queue.Queue = queue.Queue()  # (request id, finished | None on error, Sample | error)
        self._live: dict[str, dict] = {}  # request id -> {"cancel": Event, "conn": its connection}
        self._rids = itertools.count()
        self._session = False

    @classmethod
    def from_run(cls, model, tokenizer, cfg, seed: int = 0) -> "ServerEngine":
        """The run's engine: its servers checked (an error before the first step), the initial adapter loaded."""
        r = cfg.rollout
        rank, world = int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
        pool = ServerPool(rank_servers(r.server_url, rank, world), r.server_timeout_s, r.server_retry_s)
        for server, models in zip(pool.servers, pool.wait_ready()):
            served = [m for m in models.get("data", []) if not m.get("parent")]  # the base (adapters name a parent)
            log.info("rollout server %s: %s", server.url, ", ".join(
                f"{m.get('root') or m.get('id')} (max_model_len {m.get('max_model_len')})" for m in served))
            roots = {Path(str(m.get("root") or m.get("id"))).name for m in served}
            if roots and Path(str(cfg.model.name)).name not in roots:
                log.warning("rollout server %s serves %s, not the run's model.name %r: the behaviour logprobs will "
                            "not be the policy's", server.url, sorted(roots), cfg.model.name)
        if cfg.model.load_in_4bit:
            log.warning("model.load_in_4bit: the servers hold the 16-bit base, the trainer the nf4 one; the behaviour "
                        "logprobs differ from the trainer's by that rounding (algo.off_policy corrects for it)")
        engine = cls(pool, tokenizer, seed, model, r.server_adapter_dir)
        if model is not None:
            engine._upload()  # a server that cannot load adapters fails here, before the first step
        return engine

    # ------------------------------------------------------------------ the RolloutEngine interface

    def sample(self, contexts: list[list[int]], params: SamplingParams, n: int = 1, greedy: bool = False,
               max_new: list[int] | None = None) -> list[list[Sample]]:
        """n continuations of each token-id context: one request per sample, all in flight at once."""
        if self._session:
            raise RuntimeError("ServerEngine.sample inside an open session of the same engine: use the session")
        base = self._prepare()
        budgets = max_new if max_new is not None else [params.max_new_tokens] * len(contexts)
        out: list[list[Sample]] = [[Sample([], [], "length")] * n for _ in contexts]
        where = {}
        for i, (c, m) in enumerate(zip(contexts, budgets)):
            seed = base + i * n if params.stream is None else stream_seed(self.seed, "prompt", params.stream + i) % 2 ** 31
            for j in range(n if m > 0 else 0):
                where[self._start(self._body(c, params, greedy, seed + j, m, stream=False))] = (i, j)
        while where:
            for rid, finished, smp in self.poll():
                if finished:
                    i, j = where.pop(rid)
                    out[i][j] = smp
        return out

    @contextlib.contextmanager
    def session(self, params: SamplingParams, greedy: bool = False):
        """A decode session over concurrent streamed requests (`QueueSession`); what still runs on exit is aborted."""
        if self._session:
            raise RuntimeError("a server engine runs one decode session at a time")
        s = QueueSession(self, params, greedy, self._prepare())
        self._session = True
        try:
            yield s
        finally:
            s.pause()
            self._session = False

    def submit(self, context: list[int], params: SamplingParams, greedy: bool, seed: int, max_new: int) -> str:
        return self._start(self._body(context, params, greedy, seed, max_new, stream=True))

    def poll(self) -> list[tuple[str, bool, Sample]]:
        """(request id, finished, Sample so far) of the requests that moved; waits up to POLL_S for the first."""
        latest: dict[str, tuple[bool, Sample]] = {}
        try:
            event = self._events.get(timeout=POLL_S)
        except queue.Empty:
            return []
        while True:
            rid, finished, x = event
            if finished is None and rid in self._live:  # (an aborted request's failure is nobody's)
                self.abort(list(self._live))
                raise x
            if finished is not None and rid in self._live:
                latest[rid] = (finished, x)
                if finished:
                    del self._live[rid]
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return [(rid, f, s) for rid, (f, s) in latest.items()]

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            req = self._live.pop(rid, None)
            if req is None:
                continue
            req["cancel"].set()
            conn = req.get("conn")
            if conn is not None and conn.sock is not None:  # wakes the thread blocked reading the stream
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)

    def sync(self, model) -> None:
        """The policy moved: its adapter goes to the servers before the next request (one upload a step)."""
        self._model = model

    def bound_to(self, model) -> "ServerEngine":
        """The same servers, tokenizer, seed and sampling position, sampling from `model`'s adapter (versions of its
        own: one-step-off's rollout copy, tinyrl.sources.overlap)."""
        out = ServerEngine(self.pool, self.tokenizer, self.seed, model, str(self._dir.parent))
        out.calls = self.calls
        return out

    def release(self) -> None:
        """Nothing: the servers hold their own memory."""

    def state_dict(self) -> dict:
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.calls = state["seed"], state["calls"]

    def close(self) -> None:
        """Unload this engine's version from the servers and remove its adapter folder."""
        if self.version is not None:
            self._unload(self.version)
            self.version = None
        self._cleanup()

    # ------------------------------------------------------------------ adapter versions

    def _prepare(self) -> int:
        """Before sampling: upload the adapter if the policy moved since the last upload; the call's base seed."""
        if self._model is not None and (self.version is None or _version_of(self._model) != self._synced):
            self._upload()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
        self.calls += 1
        return int(torch.randint(0, 2 ** 31, (1,), generator=gen))

    def _upload(self) -> None:
        t0 = time.perf_counter()
        name = f"{self.tag}-v{next(self._versions)}"
        path = self._dir / name
        self._model.save_pretrained(str(path))  # adapter_config.json + adapter_model.safetensors
        self.pool.on_all(f"loading adapter {name} (POST /v1/load_lora_adapter; {ADAPTER_HINT})",
                         "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        old, self.version, self._synced = self.version, (name, str(path)), _version_of(self._model)
        if old is not None:
            self._unload(old)
        self.sync_times.append(time.perf_counter() - t0)

    def _unload(self, version: tuple[str, str]) -> None:
        name, path = version  # a server that restarted has forgotten it: a 404 is done too
        self.pool.on_all(f"unloading adapter {name}", "/v1/unload_lora_adapter", {"lora_name": name}, ok_status=(404,))
        shutil.rmtree(path, ignore_errors=True)

    def _reload(self, server) -> None:
        """A server forgot the current version (it restarted): load it there again."""
        name, path = self.version
        log.warning("rollout server %s lost adapter %s (restarted?): loading it again", server.url, name)
        server.request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    # ------------------------------------------------------------------ requests

    def _body(self, context: list[int], params: SamplingParams, greedy: bool, seed: int, max_new: int,
              stream: bool) -> dict:
        return {"model": self.version[0] if self.version else None, "prompt": [int(t) for t in context],
                "max_tokens": int(max_new), "n": 1, "seed": int(seed), "stream": stream,
                "temperature": 0.0 if greedy else params.temperature, "top_p": 1.0 if greedy else params.top_p,
                "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                "logprobs": 0, "return_tokens_as_token_ids": True, "stop": list(params.stop) or None,
                "stop_token_ids": [self.tokenizer.eos_token_id], "skip_special_tokens": True,
                "include_stop_str_in_output": False}

    def _start(self, body: dict) -> str:
        rid = f"r{next(self._rids)}"
        self._live[rid] = req = {"cancel": threading.Event(), "conn": None}
        # a daemon thread per request (they wait on the network): a run that ends never waits for one
        threading.Thread(target=self._run, args=(rid, body, req), name=f"tinyrl-server-{rid}", daemon=True).start()
        return rid

    def _run(self, rid: str, body: dict, req: dict) -> None:
        """On its own thread: one request to the end (retried), its news into the event queue."""
        with self._slots:
            self._request(rid, body, req)

    def _request(self, rid: str, body: dict, req: dict) -> None:
        server = self.pool.pick()

        def once() -> Sample:
            if req["cancel"].is_set():  # aborted while waiting to retry
                raise Cancelled()
            if body["stream"]:
                return self._streamed(server, rid, body, req)
            return _sample_of(json.loads(server.request("POST", "/v1/completions", body))["choices"][0])

        try:
            smp = self.pool.retrying("a completion request (POST /v1/completions)", server, once, self._reload)
            self._events.put((rid, True, smp))
        except Cancelled:
            pass
        except BaseException as e:  # noqa: BLE001 - the polling thread raises it
            self._events.put((rid, None, e if isinstance(e, RolloutServerError) else RolloutServerError(
                f"a completion request to {server.url} failed: {type(e).__name__}: {e}")))
        finally:
            self.pool.done(server)

    def _streamed(self, server, rid: str, body: dict, req: dict) -> Sample:
        ids: list[int] = []
        lps: list[float] = []
        finish = None
        for chunk in server.stream("/v1/completions", body, req["cancel"], hold=lambda c: req.__setitem__("conn", c)):
            for choice in chunk.get("choices", []):
                piece = _sample_of(choice, "paused")
                ids += piece.token_ids
                lps += piece.logprobs
                if choice.get("finish_reason"):
                    finish = _finish(choice)
            self._events.put((rid, False, Sample(list(ids), list(lps), "paused")))
        if finish is None:
            raise ConnectionError("the stream ended without a finish reason")
        return Sample(ids, lps, finish)


def _sample_of(choice: dict, finish: str | None = None) -> Sample:
    """A completion choice as a Sample: the ids of "token_id:N" tokens, their logprobs."""
    lp = choice.get("logprobs") or {}
    ids = [int(t.rsplit(":", 1)[1]) for t in lp.get("tokens") or []]
    lps = [0.0 if x is None else float(x) for x in lp.get("token_logprobs") or []]
    if len(lps) != len(ids):
        raise RolloutServerError(f"the server returned {len(ids)} tokens but {len(lps)} logprobs")
    return Sample(ids, lps, finish or _finish(choice))


def _finish(choice: dict) -> str:
    """vLLM's finish_reason "stop" covers EOS and a stop string; its stop_reason is the string (None / an id: EOS)."""
    if choice.get("finish_reason") == "length":
        return "length"
    return "stop" if isinstance(choice.get("stop_reason"), str) else "eos"


def _version_of(model) -> int:
    """Sum of the adapter tensors' in-place version counters: it changes on every optimiser step (and hand-over)."""
    return sum(p._version for p in model.parameters() if p.requires_grad)
