"""Held-out accuracy: greedy pass@1 of a task's verifier over held-out rows."""

from __future__ import annotations

from dataclasses import replace

from tinyrl.rollout.base import SamplingParams


def accuracy(engine, rows: list[dict], task, params: SamplingParams, batch_size: int = 64) -> float:
    """Fraction of `rows` whose greedy completion the task's verifier accepts."""
    if not rows:
        return float("nan")
    greedy = replace(params, temperature=1.0, top_p=1.0)
    correct = 0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i: i + batch_size]
        out = engine.generate([r["rendered"] for r in chunk], n=1, params=greedy, columns=chunk, greedy=True)
        correct += sum(task.is_correct(c, r) for c, r in zip(out.completions, chunk))
    return correct / len(rows)
