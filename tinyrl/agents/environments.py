"""Environments: what answers an agent's tool calls, one instance per trajectory.

`Environment` is the interface the multi-turn rollout loop talks to: `reset(row)` before the
first turn (the row is the dataset row of the trajectory's prompt), `step(calls)` after each
turn that made calls, returning one `ToolResult` per call. `ToolEnvironment` is the stateless
case: it answers calls with a `Toolbox`. A stateful task subclasses `Environment` (named in a
preset as `agent.environment: "package.module:Class"`); the class is built as `Class(toolbox=...)`
when its constructor takes a `toolbox` (the run's `agent.tools`), else as `Class()`.

A TRL environment class (`reset(**row)` plus public methods that are its tools, TRL's
`environment_factory` convention) plugs in unchanged: `TRLEnvironment` wraps it.

`make_environment(agent_cfg, task)` returns the factory the loop calls once per trajectory:
`factory(row)` builds a fresh environment and resets it with `row`; the loop
(`tinyrl.rollout.agent.AgentEngine`) then calls `step(calls)`. What the factory returns is `Contained`: a user's
environment whose `reset` or `step` raises (or returns the wrong number of results) gives every
call the fixed exception observation instead of stopping the run (`safe_step`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Callable

from tinyrl.agents.formats import make_format
from tinyrl.agents.tools import Toolbox, ToolCall, ToolResult, error_text, resolve_tool

log = logging.getLogger("tinyrl.agents")


class Environment:
    """Base class: reset with the trajectory's dataset row, then answer each turn's calls."""

    toolbox: Toolbox | None = None  # the tools to describe to the model (instructions, schemas)

    def reset(self, row: dict) -> None:
        pass

    def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        raise NotImplementedError


class ToolEnvironment(Environment):
    """The stateless environment: each call goes to the toolbox."""

    def __init__(self, toolbox: Toolbox):
        self.toolbox = toolbox

    def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return self.toolbox.call_many(calls)


class TRLEnvironment(Environment):
    """A TRL-style environment object: `reset(**row)`, public methods as tools (plus `toolbox`'s)."""

    def __init__(self, instance, toolbox: Toolbox | None = None, timeout: float = 10.0):
        self.instance = instance
        methods = [getattr(instance, n) for n, _ in inspect.getmembers(type(instance), inspect.isfunction)
                   if not n.startswith("_") and n not in ("reset", "get_reward")]
        extra = list(toolbox.tools.values()) if toolbox is not None else []
        self.toolbox = Toolbox(extra + methods, timeout=toolbox.timeout if toolbox else timeout)

    def reset(self, row: dict) -> None:
        self.instance.reset(**row)

    def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return self.toolbox.call_many(calls)


def safe_step(env: Environment, calls: list[ToolCall]) -> list[ToolResult]:
    """`env.step(calls)`, with an environment that raises or miscounts turned into error results."""
    try:
        results = list(env.step(calls))
        if len(results) != len(calls):
            raise ValueError(f"step returned {len(results)} results for {len(calls)} calls")
        if not all(isinstance(r, ToolResult) for r in results):
            raise TypeError("step must return ToolResult objects")
        return results
    except Exception as e:  # a user's environment must never take the run down
        log.warning("environment %s.step raised %s: %s", type(env).__name__, type(e).__name__, e)
        return [ToolResult(error_text("exception"), "exception", f"{type(e).__name__}: {e}") for _ in calls]


class Contained(Environment):
    """An environment whose `reset` and `step` never raise: what `make_environment`'s factory returns.

    A `reset` that raises is logged and leaves the environment broken: each later call gets the
    fixed exception observation (the trajectory goes on; its calls are counted as tool errors).
    Attributes other than reset/step (a stateful environment's own state) read through."""

    def __init__(self, env: Environment):
        self.env = env
        self.toolbox = env.toolbox
        self.broken: str | None = None

    def reset(self, row: dict) -> None:
        try:
            self.env.reset(row)
            self.broken = None
        except Exception as e:  # a user's environment must never take the run down
            log.warning("environment %s.reset raised %s: %s", type(self.env).__name__, type(e).__name__, e)
            self.broken = f"reset raised {type(e).__name__}: {e}"

    def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        if self.broken is not None:
            return [ToolResult(error_text("exception"), "exception", self.broken) for _ in calls]
        return safe_step(self.env, calls)

    def __getattr__(self, name):
        if name == "env":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)


def build_toolbox(agent_cfg, task=None) -> Toolbox:
    """The run's tools (`agent.tools`) as a Toolbox with `agent.tool_timeout`."""
    tools = [resolve_tool(spec, agent_cfg, task) for spec in getattr(agent_cfg, "tools", [])]
    return Toolbox(tools, timeout=getattr(agent_cfg, "tool_timeout", 10.0))


def _import_class(spec: str):
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"agent.environment: cannot import {spec!r} ({type(e).__name__}: {e}); "
                         f"use 'package.module:Class'") from e


def _takes_toolbox(cls) -> bool:
    try:
        return "toolbox" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def make_environment(agent_cfg, task=None) -> Callable[[dict], Environment]:
    """The per-trajectory factory: `factory(row)` -> a fresh `Contained` environment, reset with `row`
    (`AgentEngine` calls only `step` on it).

    Tools (and the retriever index behind `search`) are built once, here; environments share them.
    """
    toolbox = build_toolbox(agent_cfg, task)
    spec = getattr(agent_cfg, "environment", None)
    if spec is None:
        def construct() -> Environment:
            return ToolEnvironment(toolbox)
    else:
        cls = _import_class(spec)
        native = isinstance(cls, type) and issubclass(cls, Environment)
        if not native and not callable(getattr(cls, "reset", None)):
            raise ValueError(f"agent.environment: {spec!r} is neither a tinyrl Environment nor a TRL-style "
                             f"environment (a class with reset() and tool methods)")

        def construct() -> Environment:
            if not native:
                return TRLEnvironment(cls(), toolbox)
            env = cls(toolbox=toolbox) if _takes_toolbox(cls) else cls()
            if env.toolbox is None:
                env.toolbox = toolbox
            return env

    def factory(row: dict) -> Environment:
        env = Contained(construct())
        env.reset(row)
        return env

    factory.construct = construct  # the bare environment (to read its tools)
    factory.toolbox = toolbox  # what the prompt describes (format instructions / tool schemas)
    return factory


@dataclass
class AgentSetup:
    """Everything the rollout loop needs for one run: the format, the tools, the environment factory."""

    format: object  # a CallFormat
    toolbox: Toolbox
    make_env: Callable[[dict], Environment]


def build_agent(agent_cfg, task=None) -> AgentSetup:
    """Format + toolbox + environment factory for `agent_cfg` (see `make_format`, `make_environment`)."""
    make_env = make_environment(agent_cfg, task)
    toolbox = make_env.toolbox
    if getattr(agent_cfg, "environment", None) is not None:
        toolbox = make_env.construct().toolbox or toolbox  # a stateful environment may bring tools of its own
    return AgentSetup(make_format(agent_cfg.format, toolbox), toolbox, make_env)
