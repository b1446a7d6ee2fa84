"""Built-in verifiable tasks, by name (`data.task`): each makes its own train / held-out prompts and
verifies answers (the `Task` type: tinyrl/tasks/base.py).

The registry names every built-in task's module; a task's module (and what it needs: the agents'
search world, reasoning-gym) loads when a run uses it. `register_task` adds a task of your own.
"""

from __future__ import annotations

from tinyrl.registry import Registry
from tinyrl.tasks.base import Task

TASKS = Registry("data.task", {
    "arithmetic": "tinyrl.tasks.arithmetic:TASK",
    "gsm8k": "tinyrl.tasks.gsm8k:TASK",
    "dataset": "tinyrl.tasks.dataset:TASK",  # rows of data.dataset (tinyrl.data.load_rows builds them)
    "reasoning_gym": "tinyrl.tasks.reasoning_gym_task:TASK",
    "search_qa": "tinyrl.tasks.search_qa:TASK",
    "gaia": "tinyrl.tasks.search_qa:GAIA_TASK",
    "code": "tinyrl.tasks.code:TASK",  # Python problems graded by unit tests in the sandbox
})


def register_task(task: Task) -> Task:
    """Make `task` available as `data.task: <task.name>`."""
    return TASKS.register(task.name, task)


def get_task(name: str) -> Task:
    return TASKS[name]


__all__ = ["TASKS", "Task", "get_task", "register_task"]
