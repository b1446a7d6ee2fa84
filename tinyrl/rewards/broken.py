"""Rewards broken on purpose, for the monitor's failure presets; never use them for a real run.

`pays_for_length` pays for every character of a completion, up to a cap: the bug of a length
penalty whose sign was flipped. Under it the policy learns to stop ending its answers, the
completions grow into `rollout.max_new_tokens` and the task reward falls: the failure the
monitor's `length_explosion` alarm is for (`presets/tiny_length_explosion_cpu.yaml`,
`benchmarks/monitor_calibration.py`).

>>> pays_for_length(["12", "", "1234567890"], max_chars=8)
[0.25, 0.0, 1.0]
"""

from __future__ import annotations

from tinyrl.rewards.guards import completion_text


def pays_for_length(completions: list, max_chars: int = 8, **kwargs) -> list[float]:
    """min(len(completion), max_chars) / max_chars per completion: longer is better (the bug)."""
    return [min(len(completion_text(c)), max_chars) / max_chars for c in completions]
