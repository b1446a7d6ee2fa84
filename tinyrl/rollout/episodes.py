"""Trajectories that advance independently: the event loop under streaming episodes and partial rollouts.

A turn-synchronous rollout (tinyrl.rollout.agent without `agent.streaming`) decodes every live
trajectory's next turn as one call, then waits for every tool call of the turn, and a step waits for
its longest completion. Here each trajectory moves on its own through one decode session
(tinyrl.rollout.session: rows join the running batch at the next decode step and leave when they
finish):

    a row finishes its turn -> its tool call goes to a worker thread; decoding goes on for the others
    the tool returns        -> the observation is appended; the trajectory joins the batch at the next step
    `until()` becomes true  -> the session pauses: each live row keeps its tokens so far, and continues
                               later (the next training step, under the next adapter) from them

What a turn *means* (does it call a tool? is the trajectory done?) is the rules object's: `PlainTurns`
for single-turn rollouts, `tinyrl.rollout.agent.AgentEngine` for tool agents. Sampled ids, logprobs
and observation masks are exactly what the turn-synchronous path records; each sampled token also
records the policy version that sampled it (`Trajectory.versions`).
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from tinyrl.rollout.base import Rollouts, Sample, StopStrings, pack_rollouts


@dataclass
class Trajectory:
    prompt_ids: list[int]
    row: dict
    env: object = None  # the agent's environment (None: single-turn)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    obs: list[int] = field(default_factory=list)  # 1 on observation tokens
    versions: list[int] = field(default_factory=list)  # policy version of each token (observations: when added)
    turn_start: int = 0  # where the current model turn began in `ids` (a paused turn continues it)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    hit_max_turns: bool = False
    truncated: bool = False
    done: bool = False
    log: list[dict] = field(default_factory=list)

    def add(self, ids: list[int], logprobs: list[float] | None, observation: bool, version: int = 0) -> None:
        self.ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.obs += [int(observation)] * len(ids)
        self.versions += [version] * len(ids)

    def info(self) -> dict:
        return {"turns": self.turns, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "hit_max_turns": self.hit_max_turns, "turn_log": self.log}


class TurnRules(Protocol):
    """What a finished model turn means; how tools run; how trajectories become a batch."""

    def start(self, prompt_ids: list[int], row: dict) -> Trajectory: ...

    def end_turn(self, t: Trajectory, finish: str, budget: int) -> Any:
        """The turn's tokens (t.ids[t.turn_start:]) are in t: mark t done, or return a tool job to run."""

    def run_tool(self, t: Trajectory, job) -> Any:
        """On a worker thread: the job's result."""

    def observe(self, t: Trajectory, job, result, budget: int) -> None:
        """Append the result's observation to t; the next model turn starts after it (`t.turn_start`).
        May end t (the budget)."""

    def pack(self, trajs: list[Trajectory], group: list[int], prompts: list[str]) -> Rollouts: ...


class PlainTurns:
    """Single-turn rollouts: a trajectory is done when its one turn ends (EOS, a stop string, the budget)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def start(self, prompt_ids: list[int], row: dict) -> Trajectory:
        return Trajectory(list(prompt_ids), row)

    def end_turn(self, t: Trajectory, finish: str, budget: int) -> None:
        t.done, t.truncated = True, finish == "length" or len(t.ids) >= budget

    def run_tool(self, t: Trajectory, job):  # never called: a plain turn makes no tool job
        raise AssertionError("a single-turn rollout has no tools")

    observe = run_tool

    def pack(self, trajs: list[Trajectory], group: list[int], prompts: list[str]) -> Rollouts:
        return pack_rollouts(self.tokenizer, [t.prompt_ids for t in trajs], [t.ids for t in trajs],
                             [t.logprobs for t in trajs], [t.truncated for t in trajs], group, prompts,
                             [t.row for t in trajs], versions=[t.versions for t in trajs])


class EpisodeRunner:
    """Runs trajectories through a decode session until they are done, or until `until()` says stop."""

    def __init__(self, rules: TurnRules, budget: int, workers: int = 8, stops: StopStrings | None = None,
                 on_done: Callable[[Trajectory], None] | None = None):
        self.rules, self.budget, self.workers = rules, budget, workers
        self.stops = stops  # the turn's stop strings: one split by a pause is found at the seam
        self.on_done = on_done  # called on this thread as each trajectory finishes (decoding goes on)

    def run(self, session, groups: list[list[Trajectory]], streams: list[int | None] | None = None,
            version: int = 0, until: Callable[[], bool] | None = None) -> bool:
        """Advance every unfinished trajectory of `groups`; True when `until` paused them before the end.

        A group none of whose members has a token yet starts as one context sampled n times (its prefill
        shared, its draws from the prompt stream `streams[i]`, as a synchronous rollout draws them);
        every other unfinished trajectory continues alone from its prompt + its tokens so far."""
        flat = [t for g in groups for t in g]
        offsets = [0]
        for members in groups:
            offsets.append(offsets[-1] + len(members))
        at = lambda key, j: offsets[key[1]] + j if key[0] == "g" else key[1]  # noqa: E731  (session key -> flat)
        pending: dict[Future, tuple[int, Any]] = {}
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for gi, members in enumerate(groups):
                if all(not t.ids and not t.done for t in members):
                    session.add(("g", gi), members[0].prompt_ids, self.budget, n=len(members),
                                stream=None if streams is None else streams[gi])
                else:
                    for j, t in enumerate(members):
                        if not t.done:
                            self._join(session, offsets[gi] + j, t)
            while len(session) or pending:
                if len(session):
                    for key, j, sample in session.step():
                        self._turn_piece(flat[at(key, j)], at(key, j), sample, version, pool, pending)
                else:
                    wait(list(pending), return_when=FIRST_COMPLETED)
                self._collect_tools(session, flat, pending, join=True)
                if until is not None and until():
                    for key, j, sample in session.pause():
                        self._turn_piece(flat[at(key, j)], at(key, j), sample, version, pool, pending)
                    wait(list(pending))
                    self._collect_tools(session, flat, pending, join=False)
                    return any(not t.done for t in flat)
        return False

    def _join(self, session, i: int, t: Trajectory) -> None:
        session.add(("t", i), t.prompt_ids + t.ids, self.budget - len(t.ids), n=1, stream=None)

    def _turn_piece(self, t: Trajectory, i: int, sample, version: int, pool, pending) -> None:
        """A row of the session ended: its tokens join t; a paused row's turn goes on later."""
        if len(t.ids) > t.turn_start and self.stops:  # a paused turn went on: its stop string may span the pause
            sample = self._stop_at_seam(t.ids[t.turn_start:], sample)
        t.add(sample.token_ids, sample.logprobs, observation=False, version=version)
        if sample.finish == "paused":
            return
        job = self.rules.end_turn(t, sample.finish, self.budget)
        if job is not None:
            pending[pool.submit(self.rules.run_tool, t, job)] = (i, job)
        elif t.done and self.on_done is not None:
            self.on_done(t)

    def _stop_at_seam(self, before: list[int], sample: Sample) -> Sample:
        """The engine looks for stop strings in a row's new text only; a stop string begun before the pause
        and completed after it ends within `window` tokens of the seam: cut the sample there (as an
        unpaused row would have stopped)."""
        ids = sample.token_ids
        n = min(len(ids), self.stops.window)
        hits = self.stops.hit([before + ids[: i + 1] for i in range(n)])
        if True not in hits:
            return sample
        cut = hits.index(True) + 1
        return Sample(ids[:cut], sample.logprobs[:cut], "stop")

    def _collect_tools(self, session, flat: list[Trajectory], pending: dict, join: bool) -> None:
        """Observations of the tool calls that returned; their trajectories rejoin the decode batch."""
        for f in [f for f in pending if f.done()]:
            i, job = pending.pop(f)
            t = flat[i]
            self.rules.observe(t, job, f.result(), self.budget)
            if t.done and self.on_done is not None:
                self.on_done(t)
            elif join and not t.done:
                self._join(session, i, t)
