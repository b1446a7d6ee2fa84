"""Held-out evaluation: greedy pass@1 of a task's verifier, plus what else the task and the
rollouts can say (the task's own per-sample scores, e.g. EM and F1; tool use of agent runs)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tinyrl.rollout.base import SamplingParams


@dataclass
class EvalReport:
    accuracy: float  # greedy pass@1 (the task's is_correct)
    n: int  # held-out rows scored
    scores: dict[str, float] = field(default_factory=dict)  # means of the task's `scores` (e.g. em, f1)
    agent: dict[str, float] = field(default_factory=dict)  # multi-turn only: tool calls, turns, errors

    def lines(self) -> list[str]:
        out = [f"held-out accuracy (greedy pass@1): {100 * self.accuracy:.1f}%", f"  prompts: {self.n}"]
        out += [f"  {k}: {v:.3f}" for k, v in self.scores.items()]
        out += [f"  {k}: {v:.3f}" for k, v in self.agent.items()]
        return out


def evaluate_rows(engine, rows: list[dict], task, params: SamplingParams, batch_size: int = 64) -> EvalReport:
    """Greedy completions of `rows`, scored by the task's verifier (and its extra scores)."""
    if not rows:
        return EvalReport(float("nan"), 0)
    greedy = replace(params, temperature=1.0, top_p=1.0)
    correct, sums, calls, turns, errors = 0, {}, 0, 0, 0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i: i + batch_size]
        out = engine.generate([r["rendered"] for r in chunk], n=1, params=greedy, columns=chunk, greedy=True)
        for c, r in zip(out.completions, chunk):
            correct += bool(task.is_correct(c, r))
            for k, v in (task.scores(c, r) if task.scores else {}).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        for t in out.trajectories or []:
            calls, turns, errors = calls + t["tool_calls"], turns + t["turns"], errors + t["tool_errors"]
    n = len(rows)
    agent = {} if out.trajectories is None else {"tool_calls_per_question": calls / n, "turns_per_question": turns / n}
    if calls:  # no call made: the error rate was not measured (left out, not 0)
        agent["tool_error_rate"] = errors / calls
    return EvalReport(correct / n, n, {k: v / n for k, v in sums.items()}, agent)


def accuracy(engine, rows: list[dict], task, params: SamplingParams, batch_size: int = 64) -> float:
    """Fraction of `rows` whose greedy completion the task's verifier accepts."""
    return evaluate_rows(engine, rows, task, params, batch_size).accuracy
