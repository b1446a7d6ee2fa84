"""The grader's side of the code sandbox: tests -> checks the child runs, and the host's verdict.

`parse_tests` turns a row's tests (asserts, HumanEval's `check(candidate)`, stdin/stdout
cases) into steps for the sandbox child and `Check`s that stay in the host; `judge` decides
one check from what the child reported, on the value rebuilt from the host's own classes
(`_sandbox_values`: a returned Counter equals the dict of its counts, a Match is true, an object
of the solution is no value and fails). The expected value of a literal check never leaves the host.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

from tinyrl.rewards._sandbox_values import decode


@dataclass
class Check:
    src: str  # what the child evaluates (kind equal/truthy/falsy) or runs (kind "run")
    kind: str  # "equal" / "io": compare to `expected` in the host; "truthy" / "falsy"; "run": no exception
    expected: Any = None
    line: str = ""  # the grader's original statement, for reports


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


class _Rename(ast.NodeTransformer):
    """Every name `old` becomes `new`."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def _inline_check(body: list[ast.stmt], entry_point: str | None) -> list[ast.stmt]:
    """HumanEval style: the asserts of `def check(candidate)` become top-level, `candidate` -> entry_point
    (by default the name the tests pass to `check(...)`)."""
    for stmt in body:
        if (not entry_point and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"
                and len(stmt.value.args) == 1 and isinstance(stmt.value.args[0], ast.Name)):
            entry_point = stmt.value.args[0].id
    if not entry_point:
        return body
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "check" and stmt.args.args:
            rename = _Rename(stmt.args.args[0].arg, entry_point)
            out += [ast.fix_missing_locations(rename.visit(s)) for s in stmt.body]
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
              and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"):
            continue  # the `check(f)` call: its body is inlined above
        else:
            out.append(stmt)
    return out


def _io_lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in str(text).strip().splitlines()]


def parse_tests(tests: str | list | dict, entry_point: str | None = None) -> tuple[list[dict], list[Check]]:
    """Grader tests -> (steps for the child, checks).

    Assert statements become checks; other top-level statements (imports, helpers) run as
    setup, in order. A list of {"input": ..., "output": ...} dicts makes stdin/stdout checks
    (the program runs once per case; output compared line by line, trailing spaces ignored),
    as does APPS' {"inputs": [...], "outputs": [...]} (a dict or its JSON text).

    >>> steps, checks = parse_tests(["assert add(2, 2) == 4", "assert not add(0, 0)"])
    >>> [(c.kind, c.src, c.expected) for c in checks]
    [('equal', 'add(2, 2)', 4), ('falsy', 'add(0, 0)', None)]
    """
    if isinstance(tests, str) and tests.lstrip().startswith("{"):
        tests = json.loads(tests)  # APPS / CodeContests store {"inputs": [...], "outputs": [...]} as JSON
    if isinstance(tests, dict):
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    if isinstance(tests, list) and tests and all(isinstance(t, dict) for t in tests):
        checks = [Check(str(t["input"]), "io", _io_lines(t["output"]), f"io case {k}") for k, t in enumerate(tests)]
        return [{"kind": "io", "i": k, "src": c.src} for k, c in enumerate(checks)], checks
    source = tests if isinstance(tests, str) else "\n".join(tests)
    body = _inline_check(ast.parse(source).body, entry_point)
    steps: list[dict] = []
    checks: list[Check] = []
    for stmt in body:
        line = ast.unparse(stmt)
        if isinstance(stmt, ast.Assert) and _literal(stmt.test)[0]:
            continue  # `assert True` (HumanEval has them) tests nothing: it would give free credit
        if isinstance(stmt, ast.Assert):
            t = stmt.test
            check = Check(ast.unparse(t), "truthy", line=line)
            if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
                for expr, other in ((t.left, t.comparators[0]), (t.comparators[0], t.left)):
                    ok, value = _literal(other)
                    if ok and not _literal(expr)[0]:
                        check = Check(ast.unparse(expr), "equal", value, line)
                        break
            elif isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
                check = Check(ast.unparse(t.operand), "falsy", line=line)
            steps.append({"kind": "eval", "i": len(checks), "src": check.src})
            checks.append(check)
        elif any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            checks.append(Check(line, "run", line=line))
            steps.append({"kind": "exec", "i": len(checks) - 1, "src": line})
        else:
            steps.append({"kind": "exec", "src": line})
    return steps, checks


def judge(check: Check, msg: dict) -> bool:
    """Whether the child's report `msg` passes `check` (a malformed report fails)."""
    if "err" in msg:
        return False
    if check.kind == "run":
        return msg.get("ok") is True
    if "v" not in msg:
        return False
    try:
        value = decode(msg["v"])  # the host's own classes; a handle (an object of the solution) fails
        if check.kind == "equal":
            return bool(value == check.expected)
        if check.kind == "io":
            return type(value) is str and _io_lines(value) == check.expected
        return bool(value) if check.kind == "truthy" else not bool(value)
    except Exception:  # malformed report: the check fails
        return False
