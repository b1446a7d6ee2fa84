"""The `Task` type: data plus a verifier.

A task is data plus a verifier. `build` returns rows (dicts with at least a "prompt" column
and whatever the verifier needs, e.g. "answer"); `reward` has TRL's reward signature
`f(prompts, completions, **columns) -> list[float | None]`; `is_correct` scores one
completion for held-out accuracy (pass@1); `answer_of`, where a task has one, gives the final
answer of a completion in a normalised form, the answer majority voting counts (maj@k): two
completions with the same answer must get the same verdict from `is_correct`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Task:
    name: str
    description: str
    build: Callable[..., tuple[list[dict], list[dict]]]  # (num_train, num_eval, seed, **args) -> (train, eval)
    is_correct: Callable[[str, dict], bool]  # (completion, row) -> correct?
    stop: list[str] = field(default_factory=list)  # stop strings the task's answers end with
    scores: Callable[[str, dict], dict[str, float]] | None = None  # extra per-sample scores for evaluation (em, f1)
    demonstrate: Callable[[dict], list | None] | None = None  # row -> expert agent steps (tinyrl.agents.demonstrations)
    # (completion, row) -> its normalised final answer for majority voting (maj@k), None: it gives none
    answer_of: Callable[[str, dict], str | None] | None = None

    def reward(self, prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
        """1.0 for a correct completion, 0.0 otherwise (TRL reward signature)."""
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        return [float(self.is_correct(c, row)) for c, row in zip(completions, rows)]
