"""Decode sessions: rows that join a running decode batch, and leave it, one step at a time.

`engine.sample` decodes a fixed set of contexts to the end. A session lets its caller add contexts
while others are mid-decode (a multi-turn episode whose tool call returned joins at the next step)
and stop everything at any step (`pause`: a partial rollout, continued later from its context plus
the tokens so far). Engines with their own decode loop or request queue offer `session(params,
greedy)` (`HFEngine`, `VLLMEngine`); `CallSession` gives any engine with only `sample` the same
interface, a `sample` call per step over what was queued (rows cannot join mid-call): it is the default
`session` of `tinyrl.rollout.engine.SamplingEngine`. `QueueSession`
is the session of an engine with a request queue (vLLM: `submit`, `poll`, `abort`).

    with engine.session(params) as s:
        s.add("episode-3", context, max_new=64, n=4, stream=3)
        while len(s):
            for key, j, sample in s.step(): ...   # rows that finished at this step
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from tinyrl.rollout.base import Sample, SamplingParams, stream_seed


class DecodeSession(Protocol):
    def add(self, key, context: list[int], max_new: int, n: int = 1, stream: int | None = None) -> None:
        """Queue n samples of `context` (token ids); they join the running batch at the next step().
        `stream`: as SamplingParams.stream: the context's samples draw from the engine's generator
        keyed (seed, "prompt", stream) exactly as `sample` does; None: the session's own generator."""

    def step(self) -> list[tuple[Any, int, Sample]]:
        """Admit the queued contexts, run one decode step over all live rows, return (key, j, Sample)
        for each row (sample j of context `key`) that finished at this step (EOS, a stop string of
        params.stop, or its max_new budget); the Sample holds all of the row's new tokens."""

    def pause(self) -> list[tuple[Any, int, Sample]]:
        """End every live and queued row now: its tokens so far, finish="paused". Empty after."""

    def __len__(self) -> int:
        """Rows live or queued."""


class CallSession:
    """A `DecodeSession` for an engine with only `sample`: each step decodes everything queued to the
    end with `sample` calls (one per run of contexts with the same n and consecutive streams; all
    contexts of one `sample` call's shape make one call, so the same draws), and returns every row."""

    def __init__(self, engine, params: SamplingParams, greedy: bool = False):
        self.engine, self.params, self.greedy = engine, params, greedy
        self.queue: list[tuple[Any, list[int], int, int, int | None]] = []  # key, context, max_new, n, stream

    def __len__(self) -> int:
        return sum(q[3] for q in self.queue)

    def add(self, key, context: list[int], max_new: int, n: int = 1, stream: int | None = None) -> None:
        self.queue.append((key, list(context), int(max_new), n, stream))

    def step(self) -> list[tuple[Any, int, Sample]]:
        out = []
        queue, self.queue = self.queue, []
        for run in _runs(queue):
            n, stream = run[0][3], run[0][4]
            groups = self.engine.sample([q[1] for q in run], replace(self.params, stream=stream), n=n,
                                        greedy=self.greedy, max_new=[q[2] for q in run])
            out += [(q[0], j, s) for q, group in zip(run, groups) for j, s in enumerate(group)]
        return out

    def pause(self) -> list[tuple[Any, int, Sample]]:
        out = [(key, j, Sample([], [], "paused")) for key, _, _, n, _ in self.queue for j in range(n)]
        self.queue = []
        return out


class QueueSession:
    """A `DecodeSession` over an engine's request queue: `add` submits one request per sample, seeded
    as the engine's `sample` seeds them (context i of the session: `base` + i * n + j, or its stream's
    seed + j), each `step` is one `engine.poll()` (the engine's scheduler admits the new requests and
    decodes the rest); a poll's Sample holds all the tokens so far, so `pause` aborts the requests
    and returns those."""

    def __init__(self, engine, params: SamplingParams, greedy: bool, base: int):
        self.engine, self.params, self.greedy, self.base = engine, params, greedy, base
        self.contexts = 0
        self.live: dict[str, tuple[Any, int, Sample]] = {}  # request id -> (key, j, Sample so far)
        self.ended: list[tuple[Any, int, Sample]] = []  # rows without a token budget: the next step returns them

    def __len__(self) -> int:
        return len(self.live) + len(self.ended)

    def add(self, key, context: list[int], max_new: int, n: int = 1, stream: int | None = None) -> None:
        i, self.contexts = self.contexts, self.contexts + 1
        seed = self.base + i * n if stream is None else stream_seed(self.engine.seed, "prompt", stream) % 2 ** 31
        if max_new <= 0:
            self.ended += [(key, j, Sample([], [], "length")) for j in range(n)]
            return
        for j in range(n):
            rid = self.engine.submit(context, self.params, self.greedy, seed + j, max_new)
            self.live[rid] = (key, j, Sample([], [], "paused"))

    def step(self) -> list[tuple[Any, int, Sample]]:
        out, self.ended = self.ended, []
        if not self.live:
            return out
        for rid, finished, smp in self.engine.poll():
            key, j, _ = self.live[rid]
            if finished:
                del self.live[rid]
                out.append((key, j, smp))
            else:
                self.live[rid] = (key, j, smp)
        return out

    def pause(self) -> list[tuple[Any, int, Sample]]:
        if self.live:
            self.engine.abort(list(self.live))
        out = self.ended + list(self.live.values())
        self.live, self.ended = {}, []
        return out


def _runs(queue: list[tuple]) -> list[list[tuple]]:
    """Consecutive queue entries that one `sample` call draws as they would be drawn alone: the same n,
    and streams None throughout or counting up by one (`sample` gives context i the stream `stream + i`).

    >>> [[q[0] for q in r] for r in _runs([("a", [], 1, 2, 5), ("b", [], 1, 2, 6), ("c", [], 1, 2, None),
    ...                                    ("d", [], 1, 2, None), ("e", [], 1, 1, None), ("f", [], 1, 1, 9)])]
    [['a', 'b'], ['c', 'd'], ['e'], ['f']]
    """
    runs: list[list[tuple]] = []
    for q in queue:
        last = runs[-1][-1] if runs else None
        if last is not None and last[3] == q[3] and (
                (last[4] is None and q[4] is None) or (None not in (last[4], q[4]) and q[4] == last[4] + 1)):
            runs[-1].append(q)
        else:
            runs.append([q])
    return runs
