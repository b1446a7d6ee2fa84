"""Code rewards: the completion's Python, run against the grader's unit tests in the sandbox.

A row names its tests in a column (default "tests"): a list of assert statements (MBPP
style), one string of test code, HumanEval's `def check(candidate)` with an
"entry_point" column, or a list of {"input", "output"} stdin/stdout cases. The
completion's code is its last fenced ```python block (or the whole text with
`fenced_only=False`). Only the grader's tests count: asserts or a `check` the model writes
are ordinary code (a failing one fails the load), never a replacement for the grader's.

The reward is the fraction of checks passed (`partial=False`: 1.0 only when all pass);
0 when the run times out, crashes, exits early or prints more than the output limit.
A sandbox that could not start at all scores None (excluded: the model is not at fault).
See `tinyrl.rewards.sandbox` for what the sandbox does and does not protect against.

Each call tallies its outcomes (`tinyrl.rewards.tally`; the step's metrics.jsonl row sums them):
`sandbox/<outcome>` per completion, one of OUTCOMES (`crash`: the code raised, exited or died
before the checks ran to the end, a syntax error included; `error`: the sandbox could not run it,
the sample is excluded), `sandbox/exit_call` for code that calls sys.exit / os._exit / exit /
quit or raises SystemExit, and `sandbox_time`, the seconds the call spent running the sandboxes.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

from tinyrl.rewards import tally
from tinyrl.rewards.guards import completion_text
from tinyrl.rewards.sandbox import Limits, SandboxResult, run_tests

log = logging.getLogger("tinyrl.rewards.code")
_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_EXIT_CALL = re.compile(r"(?<![\w.])(?:sys\.exit|os\._exit|exit|quit)\s*\(|\bSystemExit\b")
OUTCOMES = ("pass", "fail", "timeout", "crash", "output_limit", "no_code", "error")
_warned_tests: set[int] = set()
_lock = threading.Lock()
_BY_STATUS = {"timeout": "timeout", "crashed": "crash", "load_error": "crash", "output_limit": "output_limit"}


def outcome_of(result: SandboxResult | None) -> str:
    """One of OUTCOMES for a sandbox result (None: there was no code to run)."""
    if result is None:
        return "no_code"
    if result.status == "ok":
        return "pass" if result.score == 1.0 else "fail"
    return _BY_STATUS.get(result.status, "error")


def tally_outcomes(codes: list[str | None], results: list[SandboxResult | None], seconds: float) -> None:
    """Tally one call's outcomes (every OUTCOMES key, 0 included: the call measured them all)."""
    for name in OUTCOMES:
        tally.add(f"sandbox/{name}", 0)
    tally.add("sandbox/exit_call", 0)
    for code, r in zip(codes, results):
        tally.add(f"sandbox/{outcome_of(r)}")
        tally.add("sandbox/exit_call", int(bool(code and _EXIT_CALL.search(code))))
    tally.add("sandbox_time", seconds)


def extract_code(completion, fenced_only: bool = True) -> str | None:
    """The last fenced code block (```python preferred over a bare ```), or None.

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    >>> extract_code("no code here") is None
    True
    """
    text = completion_text(completion)
    blocks = _FENCE.findall(text)
    tagged = [body for lang, body in blocks if lang]
    if tagged or blocks:
        return (tagged or [b for _, b in blocks])[-1]
    return None if fenced_only else text


def run_completions(codes: list[str | None], tests: list, entry_points: list | None = None,
                    limits: Limits | None = None, workers: int | None = None,
                    weak_isolation: bool = False) -> list[SandboxResult | None]:
    """One sandbox run per completion, `workers` at a time (None where there was no code)."""
    entry_points = entry_points or [None] * len(codes)
    workers = workers or max(1, min(4, os.cpu_count() or 1))

    def one(k: int) -> SandboxResult | None:
        if not codes[k] or not codes[k].strip():
            return None
        try:
            return run_tests(codes[k], tests[k], entry_points[k], limits, weak_isolation=weak_isolation)
        except (SyntaxError, ValueError, TypeError, KeyError, RecursionError) as e:  # the grader's tests do not parse
            _warn_bad_tests(tests[k], e)
            return SandboxResult("error", [], load_error=f"bad tests: {e}")

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(one, range(len(codes))))


def _warn_bad_tests(tests, e: Exception) -> None:
    """One warning per distinct set of tests that does not parse, naming it by its first line (the reward does not
    know the dataset's row numbers); each of its samples is excluded."""
    text = tests if isinstance(tests, str) else "\n".join(map(str, tests)) if isinstance(tests, list) else repr(tests)
    key = zlib.crc32(text.encode("utf-8", "replace"))
    with _lock:
        if key in _warned_tests:
            return
        _warned_tests.add(key)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    log.warning("code_tests: the tests starting %r cannot be read (%s: %s); every sample of their row is excluded "
                "(scored None); warned once per set of tests", first[:100], type(e).__name__, str(e)[:200])


def code_tests_reward(prompts: list, completions: list, tests: list | None = None, entry_point: list | None = None,
                      partial: bool = True, fenced_only: bool = True, tests_column: str = "tests",
                      cpu_s: float = 2.0, wall_s: float = 5.0, memory_mb: int = 512, workers: int | None = None,
                      weak_isolation: bool = False, **columns) -> list[float | None]:
    """Fraction of the grader's tests the completion's code passes, run in the sandbox.

    On a host without mount namespaces the sandbox refuses to run (every sample None, with a warning)
    unless `weak_isolation=True` (a preset's `kwargs: {weak_isolation: true}`): see docs/rewards.md.

    >>> code_tests_reward(["Write add."] * 2, ["```python\\ndef add(a, b):\\n    return a + b\\n```",
    ...                                      "```python\\ndef add(a, b):\\n    return a - b\\n```"],
    ...                   tests=[["assert add(2, 2) == 4", "assert add(0, 0) == 0"]] * 2)
    [1.0, 0.5]
    """
    tests = tests if tests is not None else columns[tests_column]
    codes = [extract_code(c, fenced_only) for c in completions]
    limits = Limits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb)
    t0 = time.perf_counter()
    results = run_completions(codes, tests, entry_point, limits, workers, weak_isolation)
    tally_outcomes(codes, results, time.perf_counter() - t0)
    out: list[float | None] = []
    for r in results:
        if r is None:
            out.append(0.0)
        elif r.status == "error":
            out.append(None)
        else:
            out.append(r.score if partial else float(r.score == 1.0))
    return out
