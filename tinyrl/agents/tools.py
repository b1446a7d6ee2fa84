"""Tools: plain typed Python functions with a docstring (TRL's `tools=` convention), run safely.

A tool is any function whose arguments carry type hints and whose Google-style docstring has
an `Args:` section: `transformers.utils.get_json_schema` turns it into the JSON schema that
chat templates render (the same schema TRL and transformers build), so a TRL user's tool plugs
in unchanged. Async functions work too.

`Toolbox.call` never raises. A call that names no known tool, passes arguments the schema
does not allow, raises, or runs past `timeout` seconds returns a fixed observation text and
an error kind; the exception text goes to `ToolResult.detail` (logged, never shown to the
model, so a failure costs the policy the same few tokens every time):

    error kind       observation text
    unknown_tool     Error: unknown tool. Available tools: search.
    bad_arguments    Error: bad arguments. Expected: search(query).
    exception        Error: the tool failed.
    timeout          Error: the tool timed out.
    parse_error      Error: the tool call could not be parsed.

A timed-out call keeps running in its (daemon) thread until it returns: Python cannot stop a
thread. Tools that may hang for good should enforce their own limit (the `python` tool runs
in the process sandbox, which kills it).

>>> def add(a: int, b: int) -> int:
...     '''Add two integers.
...
...     Args:
...         a: the first
...         b: the second
...     '''
...     return a + b
>>> box = Toolbox([add])
>>> box.call(ToolCall("add", {"a": 2, "b": 3}))
ToolResult(text='5', error=None, detail='')
>>> box.call(ToolCall("add", {"a": 2})).error, box.call(ToolCall("mul", {})).text
('bad_arguments', 'Error: unknown tool. Available tools: add.')
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tinyrl.names import TOOLS
from tinyrl.registry import load_object

log = logging.getLogger("tinyrl.agents")

ERROR_KINDS = ("unknown_tool", "exception", "timeout", "bad_arguments", "parse_error")


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    raw: str = ""  # the call's text as generated
    error: str | None = None  # set by a parser that could not read the call (-> a parse_error result)


@dataclass
class ToolResult:
    text: str  # the observation text the model sees
    error: str | None = None  # None | one of ERROR_KINDS
    detail: str = ""  # what went wrong (exception text ...), for logs only


def error_text(kind: str, tool_names: list[str] | None = None, signature: str = "") -> str:
    """The fixed observation text of an error kind (see the module docstring)."""
    if kind == "unknown_tool":
        return f"Error: unknown tool. Available tools: {', '.join(tool_names or []) or 'none'}."
    if kind == "bad_arguments":
        return f"Error: bad arguments. Expected: {signature}." if signature else "Error: bad arguments."
    return {"exception": "Error: the tool failed.", "timeout": "Error: the tool timed out.",
            "parse_error": "Error: the tool call could not be parsed."}[kind]


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list, tuple), "object": (dict,), "null": (type(None),),
}


def _type_ok(value: Any, spec: dict) -> bool:
    """Whether a JSON value fits a (get_json_schema) property schema; unknown shapes pass."""
    if value is None:
        return bool(spec.get("nullable")) or spec.get("type") == "null"
    types = spec.get("type")
    if types is None:
        return True
    for t in ([types] if isinstance(types, str) else types):
        allowed = _JSON_TYPES.get(t)
        if allowed is None:
            return True
        if isinstance(value, bool) and t in ("integer", "number"):
            continue  # JSON true is not a number
        if isinstance(value, allowed):
            return True
    return False


def schema_of(fn: Callable) -> dict:
    """The tool's JSON schema (transformers' `get_json_schema`); a clear error for a bad tool."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # TypeHintParsingException / DocstringParsingException
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(
            f"tool {name!r} cannot be described to the model ({type(e).__name__}: {e}). A tool is a function "
            f"with type hints on every argument and a docstring with an 'Args:' section (TRL's tools= convention)."
        ) from e


class Toolbox:
    """Named tools with their schemas; `call` runs one with a timeout and never raises."""

    def __init__(self, tools: list[Callable], timeout: float = 10.0):
        self.timeout = timeout
        self.tools: dict[str, Callable] = {}
        self._schemas: dict[str, dict] = {}
        for fn in tools:
            schema = schema_of(fn)
            name = schema["function"]["name"]
            if name in self.tools:
                raise ValueError(f"two tools are named {name!r}; tool names must be unique")
            self.tools[name] = fn
            self._schemas[name] = schema

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self) -> list[dict]:
        return list(self._schemas.values())

    def signature(self, name: str) -> str:
        """`search(query)`: the tool's name and parameters, for the bad-arguments text."""
        props = self._schemas[name]["function"].get("parameters", {}).get("properties", {})
        return f"{name}({', '.join(props)})"

    def check_arguments(self, name: str, arguments: Any) -> str | None:
        """None when `arguments` fit the tool's schema, else what is wrong."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        params = self._schemas[name]["function"].get("parameters", {})
        props, required = params.get("properties", {}), params.get("required", [])
        missing = [r for r in required if r not in arguments]
        extra = [k for k in arguments if k not in props]
        if missing or extra:
            return f"missing {missing}, unexpected {extra}"
        wrong = [k for k, v in arguments.items() if not _type_ok(v, props[k])]
        return f"wrong type for {wrong}" if wrong else None

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure becomes a fixed observation and an error kind."""
        if call.error is not None:
            return ToolResult(error_text("parse_error"), "parse_error", call.error)
        if call.name not in self.tools:
            return ToolResult(error_text("unknown_tool", self.names), "unknown_tool", f"no tool {call.name!r}")
        problem = self.check_arguments(call.name, call.arguments)
        if problem is not None:
            return ToolResult(error_text("bad_arguments", signature=self.signature(call.name)), "bad_arguments", problem)
        return self._run(call, time.monotonic() + self.timeout)

    def call_many(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Run calls concurrently (each in its own thread, one shared deadline); results in order."""
        if len(calls) <= 1:
            return [self.call(c) for c in calls]
        results: list[ToolResult | None] = [None] * len(calls)

        def one(i: int, c: ToolCall) -> None:
            results[i] = self.call(c)

        threads = [threading.Thread(target=one, args=(i, c), daemon=True) for i, c in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()  # each call enforces its own timeout, so this returns within ~timeout
        return [r if r is not None else ToolResult(error_text("exception"), "exception", "no result") for r in results]

    def _run(self, call: ToolCall, deadline: float) -> ToolResult:
        fn = self.tools[call.name]
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                out = fn(**call.arguments)
                if inspect.isawaitable(out):
                    out = asyncio.run(_as_coroutine(out))
                box["out"] = out
            except BaseException as e:  # noqa: BLE001  a tool must never take the run down
                box["exc"] = e

        worker = threading.Thread(target=target, name=f"tinyrl-tool-{call.name}", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            log.warning("tool %r timed out after %.1fs", call.name, self.timeout)
            return ToolResult(error_text("timeout"), "timeout", f"no result after {self.timeout}s")
        if "exc" in box:
            e = box["exc"]
            log.warning("tool %r raised %s: %s", call.name, type(e).__name__, e)
            return ToolResult(error_text("exception"), "exception", f"{type(e).__name__}: {e}")
        return ToolResult(to_text(box.get("out")))


async def _as_coroutine(awaitable):
    return await awaitable


def to_text(value: Any) -> str:
    """A tool's return value as observation text: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


# --------------------------------------------------------------------------- the registry

# name -> builder(agent_cfg, task) -> tool function; a built-in's module loads when a run uses it
def register_tool(name: str):
    """Decorator: make a tool builder available to presets as `agent.tools: [name]`."""

    def wrap(builder):
        return TOOLS.register(name, builder)

    return wrap


def resolve_tool(spec: str, agent_cfg=None, task=None) -> Callable:
    """A registry name (built with the run's agent config) or `module:function` (used unchanged)."""
    if spec in TOOLS:
        return TOOLS[spec](agent_cfg, task)
    if ":" in spec:
        try:
            return load_object(spec)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"agent.tools: cannot import {spec!r} ({type(e).__name__}: {e})") from e
    raise ValueError(f"agent.tools: unknown tool {spec!r}; use one of {sorted(TOOLS)} or 'module:function'")
