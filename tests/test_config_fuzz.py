"""Every field of every config section under hostile values (issue 49): wrong types, empty, zero, negative, huge,
NaN and infinities, format specs, paths to FIFOs and devices, NUL bytes, deep and long values. Each case resolves
to a ConfigError that names a field, or is accepted within its bounds; never another exception, never a hang.

The fields are read from the schema (`tinyrl.config.RunConfig`), so a field is fuzzed the day it is added. The
default suite draws a fixed-seed sample of 400 (hypothesis, derandomized); the slow suite tries every field with
every value (about 7,000 cases), and 150 drawn cases through the whole resolution (`resolve`, the planner's
preflight and the optional-package checks included).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
import typing
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinyrl.config import ConfigError, RunConfig, load_config, resolve
from tinyrl.config.coerce import DEFAULT_LIMITS

SECTIONS = {f.name: f.type for f in dataclasses.fields(RunConfig)}


def leaf_fields() -> list[tuple[str, object]]:
    """(dotted path, annotation) of every field a preset can set."""
    out = []
    for f in dataclasses.fields(RunConfig):
        tp = typing.get_type_hints(RunConfig)[f.name]
        if dataclasses.is_dataclass(tp):
            out += [(f"{f.name}.{g.name}", typing.get_type_hints(tp)[g.name]) for g in dataclasses.fields(tp)]
        else:
            out.append((f.name, tp))
    return out


FIELDS = leaf_fields()
NAMES = {name for name, _ in FIELDS} | set(SECTIONS)


@pytest.fixture(scope="module")
def fifo(tmp_path_factory):
    path = tmp_path_factory.mktemp("fifo") / "pipe.jsonl"
    os.mkfifo(path)
    return str(path)


def hostile(fifo_path: str) -> list:
    return [None, "", " ", "x" * 200_000, "a\x00b", "{question.__class__.__mro__}", "{question[__class__]}",
            "{question:>2000000000}", "/dev/zero", "/dev/null", fifo_path, "../../../../etc/passwd", "~", "*",
            "&a [*a, *a]", -1, 0, 1, 10**12, -(10**12), 2**64, 0.5, -0.5, 1e308, float("nan"), float("inf"),
            -float("inf"), True, False, [], {}, [1] * 20_000, [[[[[[[[[[1]]]]]]]]]], {"a": 1}, ["x"] * 3,
            {"prompt": "{q.__class__}"}]


@contextmanager
def time_box(seconds: int):
    """A case that runs past `seconds` fails (SIGALRM in the main thread), as a hang would."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def names_a_field(message: str) -> bool:
    """The error's first words are a field's dotted path (with an index or key: `agent.tools[0]`)."""
    head = message.split(":", 1)[0].strip()
    root = head.split("[", 1)[0]
    return root in NAMES or any(root.startswith(n + ".") for n in NAMES) or head.startswith(("preset", "override"))


def within_bounds(cfg: RunConfig) -> list[str]:
    """Numbers an accepted config holds outside the generic bounds (a section's LIMITS are narrower)."""
    bad = []
    for name, _ in FIELDS:
        section, _, field = name.partition(".")
        v = getattr(getattr(cfg, section), field) if field else getattr(cfg, section)
        if isinstance(v, float) and not math.isfinite(v):
            bad.append(f"{name}={v}")
        elif isinstance(v, int) and not isinstance(v, bool) and not (
                DEFAULT_LIMITS[int][0] <= v <= DEFAULT_LIMITS[int][1]):
            bad.append(f"{name}={v}")
    return bad


def try_case(name: str, value, full: bool = False) -> None:
    started = time.monotonic()
    with time_box(30):
        try:
            cfg = (resolve("tiny_grpo_cpu", overrides={name: value}).cfg if full
                   else load_config("tiny_grpo_cpu", {name: value})[1])
        except ConfigError as e:
            assert names_a_field(str(e)), f"{name}={value!r:.60}: the error names no field: {e}"
            return
        except Exception as e:  # noqa: BLE001 - anything but a ConfigError is what this test looks for
            raise AssertionError(f"{name}={value!r:.60}: {type(e).__name__}: {e}") from e
    assert not within_bounds(cfg), f"{name}={value!r:.60} accepted out of bounds: {within_bounds(cfg)}"
    assert time.monotonic() - started < 30


@settings(max_examples=400, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_values_fail_clearly_or_stay_bounded(data, fifo):
    name, _ = data.draw(st.sampled_from(FIELDS), label="field")
    value = data.draw(st.sampled_from(hostile(fifo)), label="value")
    try_case(name, value)


@pytest.mark.slow
def test_every_field_with_every_hostile_value(fifo):
    failures = []
    for name, _ in FIELDS:
        for value in hostile(fifo):
            try:
                try_case(name, value)
            except AssertionError as e:
                failures.append(str(e)[:300])
    print(f"{len(FIELDS)} fields x {len(hostile(fifo))} values")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_values_through_the_whole_resolution(data, fifo):
    """As above, through `resolve` as a training process calls it: the planner's preflight, the optional packages."""
    name, _ = data.draw(st.sampled_from(FIELDS), label="field")
    try_case(name, data.draw(st.sampled_from(hostile(fifo)), label="value"), full=True)
