"""Toolbox: TRL-style tools plug in unchanged; failures give fixed observations and error kinds, never a crash."""

import asyncio
import threading
import time

import pytest

from tinyrl.agents.tools import ERROR_KINDS, Toolbox, ToolCall, ToolResult, error_text, resolve_tool


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather of a city.

    Args:
        city: the city, e.g. "Paris".
        unit: "celsius" or "fahrenheit".
    """
    return f"{city}: 21 degrees {unit}"


def boom(x: int) -> str:
    """Always raises.

    Args:
        x: anything.
    """
    raise RuntimeError("the disk is on fire")


_release = threading.Event()


def hang(x: int) -> str:
    """Never returns within the test's timeout.

    Args:
        x: anything.
    """
    _release.wait(30)
    return "late"


async def async_add(a: int, b: float) -> float:
    """Add asynchronously.

    Args:
        a: an integer.
        b: a number.
    """
    await asyncio.sleep(0)
    return a + b


def test_trl_style_tool_plugs_in_unchanged_with_its_schema():
    box = Toolbox([get_weather])
    assert box.schemas() == [{
        "type": "function",
        "function": {
            "name": "get_weather", "description": "Get the current weather of a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": 'the city, e.g. "Paris".'},
                "unit": {"type": "string", "description": '"celsius" or "fahrenheit".'}},
                "required": ["city"]},
            "return": {"type": "string"}}}]
    assert box.call(ToolCall("get_weather", {"city": "Oslo"})) == ToolResult("Oslo: 21 degrees celsius")
    assert box.call(ToolCall("get_weather", {"city": "Oslo", "unit": "kelvin"})).text == "Oslo: 21 degrees kelvin"


def test_the_same_tool_through_the_registry_spec():
    fn = resolve_tool("tests.agents.test_tools:get_weather")
    # the function itself, imported by its module path (pytest may have imported this file under another name)
    assert (fn.__module__, fn.__qualname__) == ("tests.agents.test_tools", "get_weather")
    assert Toolbox([fn]).schemas() == Toolbox([get_weather]).schemas() and fn("Oslo") == get_weather("Oslo")


def test_async_tool_and_non_string_results():
    box = Toolbox([async_add])
    assert box.call(ToolCall("async_add", {"a": 2, "b": 0.5})) == ToolResult("2.5")


@pytest.mark.parametrize("call,kind", [
    (ToolCall("nope", {}), "unknown_tool"),
    (ToolCall("get_weather", {}), "bad_arguments"),  # missing required
    (ToolCall("get_weather", {"city": "Oslo", "when": "now"}), "bad_arguments"),  # unexpected
    (ToolCall("get_weather", {"city": 3}), "bad_arguments"),  # wrong type
    (ToolCall("get_weather", ["Oslo"]), "bad_arguments"),  # not an object
    (ToolCall("boom", {"x": 1}), "exception"),
    (ToolCall("boom", {"x": True}), "bad_arguments"),  # a bool is not an integer
    (ToolCall("get_weather", {}, error="invalid JSON"), "parse_error"),
])
def test_failures_give_the_fixed_observation_and_kind(call, kind):
    box = Toolbox([get_weather, boom])
    res = box.call(call)
    assert res.error == kind
    expected = {"unknown_tool": "Error: unknown tool. Available tools: get_weather, boom.",
                "bad_arguments": f"Error: bad arguments. Expected: {call.name}(" + (
                    "city, unit" if call.name == "get_weather" else "x") + ").",
                "exception": "Error: the tool failed.",
                "parse_error": "Error: the tool call could not be parsed."}[kind]
    assert res.text == expected
    assert "fire" not in res.text  # the exception text stays out of the observation ...
    if kind == "exception":
        assert "the disk is on fire" in res.detail  # ... and goes to the log detail


def test_a_hanging_tool_times_out_and_the_next_call_still_works():
    box = Toolbox([hang, get_weather], timeout=0.3)
    t0 = time.monotonic()
    res = box.call(ToolCall("hang", {"x": 1}))
    assert time.monotonic() - t0 < 2.0
    assert (res.text, res.error) == ("Error: the tool timed out.", "timeout")
    assert box.call(ToolCall("get_weather", {"city": "Oslo"})).error is None
    _release.set()


def test_call_many_runs_concurrently_in_order():
    _release.clear()
    box = Toolbox([hang, get_weather, boom], timeout=0.5)
    t0 = time.monotonic()
    out = box.call_many([ToolCall("hang", {"x": 1}), ToolCall("get_weather", {"city": "A"}),
                         ToolCall("hang", {"x": 2}), ToolCall("boom", {"x": 0}), ToolCall("zzz", {})])
    assert time.monotonic() - t0 < 1.5  # two hangs in parallel, not one after the other
    assert [r.error for r in out] == ["timeout", None, "timeout", "exception", "unknown_tool"]
    assert out[1].text == "A: 21 degrees celsius"
    _release.set()


def test_no_tools_at_all_answers_every_call_as_unknown():
    box = Toolbox([])
    res = box.call(ToolCall("search", {"query": "x"}))
    assert (res.text, res.error) == ("Error: unknown tool. Available tools: none.", "unknown_tool")


def test_a_tool_that_cannot_be_described_fails_at_build_time():
    def untyped(x):
        """No hints.

        Args:
            x: something.
        """

    with pytest.raises(ValueError, match="type hints on every argument"):
        Toolbox([untyped])
    with pytest.raises(ValueError, match="two tools are named"):
        Toolbox([get_weather, get_weather])


def test_every_error_kind_has_a_fixed_text():
    for kind in ERROR_KINDS:
        assert error_text(kind, ["search"]).startswith("Error:")


def test_unknown_registry_tool_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown tool 'serch'"):
        resolve_tool("serch")
    with pytest.raises(ValueError, match="cannot import 'no.such.module:f'"):
        resolve_tool("no.such.module:f")
