"""Run TRL's own reward functions (`trl.rewards`) on tinyrl's string completions.

tinyrl's rollouts carry completions as text; TRL's rewards (`think_format_reward`,
`accuracy_reward`, ...) read chat messages (`completion[0]["content"]`). `as_chat` wraps a
reward so it gets the chat form; the registered `trl` reward loads one by name:

    reward:
      functions:
        - {name: trl, kwargs: {fn: think_format_reward}}
        - {name: trl, kwargs: {fn: get_soft_overlong_punishment, args: {max_completion_len: 256, soft_punish_cache: 32}}}

A reward that takes chat completions already (`module:function` in a preset) can be given
directly; a list of messages passes through `as_chat` unchanged.
"""

from __future__ import annotations

import functools
from typing import Callable

from tinyrl.errors import MissingExtra


def to_chat(completions: list) -> list:
    """Strings become `[{"role": "assistant", "content": text}]`; chat messages stay as they are."""
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]


def as_chat(fn: Callable) -> Callable:
    """`fn` called with chat-form completions (TRL reward signature kept).

    >>> import re
    >>> starts_with_think = lambda completions, **kw: [float(c[0]["content"].startswith("<think>")) for c in completions]
    >>> as_chat(starts_with_think)(prompts=["Q", "Q"], completions=["<think>x</think>y", "y"])
    [1.0, 0.0]
    """

    @functools.wraps(fn)
    def wrapped(*args, completions: list, **kwargs):
        return fn(*args, completions=to_chat(completions), **kwargs)

    return wrapped


@functools.lru_cache(maxsize=None)
def _trl_fn(name: str, args: tuple) -> Callable:
    try:
        import trl.rewards as trl_rewards  # noqa: PLC0415 (lazy: trl is optional)
    except ImportError as e:
        raise MissingExtra("the 'trl' reward needs TRL: pip install trl") from e
    fn = getattr(trl_rewards, name)
    return fn(**dict(args)) if name.startswith("get_") else fn  # get_*: a factory that builds the reward


def trl_reward(prompts: list, completions: list, fn: str = "think_format_reward", args: dict | None = None,
               **columns) -> list:
    """TRL's reward `trl.rewards.<fn>` (a `get_*` factory is called with `args` first), on chat-form completions."""
    reward = _trl_fn(fn, tuple(sorted((args or {}).items())))
    return reward(prompts=prompts, completions=to_chat(completions), **columns)
