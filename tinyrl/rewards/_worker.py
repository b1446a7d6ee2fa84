"""The worker process of `tinyrl.rewards.pool`: a standalone script (stdlib only at import).

It is started by path, so it never imports the tinyrl package (nor torch): it reads
`(index, "module:function", args)` calls from its pipe, runs them and sends back
`(index, ok, value_or_error)`. Calls named without a module run the functions below.
"""

import importlib
import sys
from multiprocessing.connection import Connection


def math_equiv(gold: str, pred: str) -> bool:
    """math-verify equivalence of two extracted answers, its own signal timeouts off.

    Both sides are wrapped in `\\boxed{}` so math-verify reads them as the final answer
    (plain "1/2", "0.5", "\\frac{1}{2}", "x+1" and sets all parse that way).
    """
    from math_verify import parse, verify  # noqa: PLC0415 (lazy: only math rewards need it)

    g = parse("\\boxed{" + gold + "}", parsing_timeout=None)
    p = parse("\\boxed{" + pred + "}", parsing_timeout=None)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=None))


def warm_math() -> bool:
    """Import math-verify (and sympy) once, so the first real call is not the slow one."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout is disabled" notice
    return math_equiv("1/2", "0.5")


def ready() -> bool:
    """The start-up call: answers once the interpreter is up."""
    return True


def _resolve(ref: str):
    if ":" not in ref:
        return globals()[ref]
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def main(fd: int) -> None:
    conn = Connection(fd)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        i, ref, args = msg
        try:
            out = (i, True, _resolve(ref)(*args))
        except BaseException as e:  # noqa: BLE001 (report everything, keep serving)
            out = (i, False, f"{type(e).__name__}: {e}"[:500])
        try:
            conn.send(out)
        except Exception as e:  # an unpicklable result
            conn.send((i, False, f"unpicklable result: {type(e).__name__}: {e}"[:500]))


if __name__ == "__main__":
    main(int(sys.argv[1]))
