"""The `python` tool: run model-written code in tinyrl's process sandbox, return what it printed.

It calls only the sandbox's public API (`tinyrl.rewards.sandbox.run_tests` with no checks,
`Limits`): a fresh locked-down interpreter per call, CPU / memory / wall-clock limits, no
network where the kernel allows namespaces. The observation is the program's stdout and stderr
(cut to `max_chars`), or a fixed line when it timed out, did not compile or printed nothing.
"""

from __future__ import annotations

from typing import Callable

from tinyrl.rewards.sandbox import Limits, run_tests

NO_OUTPUT = "(no output)"


def make_python_tool(timeout: float = 5.0, max_chars: int = 2000) -> Callable[[str], str]:
    limits = Limits(wall_s=timeout, cpu_s=timeout)

    def python(code: str) -> str:
        """Run a Python program and return what it prints (stdout and stderr).

        Args:
            code: the program; print what you want to see.
        """
        result = run_tests(code, [], limits=limits)
        if result.status == "load_error":
            return f"Error: {result.load_error}"[:max_chars]
        if result.status == "timeout":
            return f"Error: the program ran longer than {timeout:g} seconds."
        if result.status == "output_limit":
            return "Error: the program printed too much."
        text = result.output.strip()
        if result.status != "ok" and not text:
            return "Error: the program crashed."
        return text[:max_chars] if text else NO_OUTPUT

    return python


def build_python_tool(agent_cfg, task) -> Callable[[str], str]:
    # the sandbox keeps its own wall clock a little under the toolbox's timeout, so it reports first
    timeout = float(getattr(agent_cfg, "tool_timeout", 10.0))
    return make_python_tool(timeout=max(1.0, timeout - 2.0))
