"""The procedurally generated code world of the shipped tiny code model (tiny-code).

A problem is a composition of two operations on one argument, described in words: a list of
integers `xs` ("keep the even numbers of xs, then return the sum") or a string `s` ("reverse the
string, then uppercase it"). The first operation is a transform (list -> list, str -> str), the
second a transform or a reducer (list -> number, str -> number / bool). Its reference solution is
always two lines, so the pattern is learnable by a tiny model:

    def evens_sum(xs):
        xs = [x for x in xs if x % 2 == 0]
        return sum(xs)

and it comes with three asserts (MBPP `test_list`) that tell the composition apart from the
"shortcut" that skips the first operation (`return sum(xs)`): compositions no three inputs can
tell apart from their shortcut (sort then sum, ...) are left out of the world.

The held-out split is BY COMPOSITION: a fixed share of the (first, second) operation pairs never
appear in train rows (nor in pretraining, scripts/pretrain_tiny_code.py draws train pairs only),
while every single operation appears in train in both positions. Rows are MBPP-style dicts:
`task_id`, `text`, `test_list`, `entry_point`, plus `code` (the reference solution) and
`composition` ("evens+sum"). scripts/make_code_world.py writes them to tinyrl/assets/code-world/.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

VOWELS = "aeiou"
WORDS = ["cat", "dog", "sun", "moon", "tree", "blue", "red", "apple", "river", "stone", "bird", "fish",
         "rain", "snow", "star", "book", "lamp", "road", "hill", "wind"]


@dataclass(frozen=True)
class Op:
    """One operation: its key, its kind (list/str), transform or reducer, its words and its expression."""

    key: str
    kind: str  # "list" | "str"
    transform: bool
    words: str  # imperative, e.g. "keep the even numbers"
    expr: str  # Python over the argument (xs / s)
    fn: object  # the same operation as a Python callable (for the asserts)


def _vowel_count(s: str) -> int:
    return sum(1 for c in s if c in VOWELS)


OPS: list[Op] = [
    Op("rev", "list", True, "reverse the list", "xs[::-1]", lambda xs: xs[::-1]),
    Op("sort", "list", True, "sort the list", "sorted(xs)", sorted),
    Op("evens", "list", True, "keep the even numbers", "[x for x in xs if x % 2 == 0]",
       lambda xs: [x for x in xs if x % 2 == 0]),
    Op("odds", "list", True, "keep the odd numbers", "[x for x in xs if x % 2 == 1]",
       lambda xs: [x for x in xs if x % 2 == 1]),
    Op("pos", "list", True, "keep the positive numbers", "[x for x in xs if x > 0]", lambda xs: [x for x in xs if x > 0]),
    Op("double", "list", True, "double each number", "[x * 2 for x in xs]", lambda xs: [x * 2 for x in xs]),
    Op("inc", "list", True, "add one to each number", "[x + 1 for x in xs]", lambda xs: [x + 1 for x in xs]),
    Op("square", "list", True, "square each number", "[x * x for x in xs]", lambda xs: [x * x for x in xs]),
    Op("neg", "list", True, "negate each number", "[-x for x in xs]", lambda xs: [-x for x in xs]),
    Op("tail", "list", True, "drop the first number", "xs[1:]", lambda xs: xs[1:]),
    Op("sum", "list", False, "return the sum", "sum(xs)", sum),
    Op("len", "list", False, "return how many numbers there are", "len(xs)", len),
    Op("max", "list", False, "return the largest number or 0 if there is none", "max(xs, default=0)",
       lambda xs: max(xs, default=0)),
    Op("min", "list", False, "return the smallest number or 0 if there is none", "min(xs, default=0)",
       lambda xs: min(xs, default=0)),
    Op("first", "list", False, "return the first number or 0 if there is none", "xs[0] if xs else 0",
       lambda xs: xs[0] if xs else 0),
    Op("srev", "str", True, "reverse the string", "s[::-1]", lambda s: s[::-1]),
    Op("upper", "str", True, "uppercase it", "s.upper()", str.upper),
    Op("lower", "str", True, "lowercase it", "s.lower()", str.lower),
    Op("nospace", "str", True, "remove the spaces", 's.replace(" ", "")', lambda s: s.replace(" ", "")),
    Op("novowel", "str", True, "remove the vowels", '"".join(c for c in s if c not in "aeiou")',
       lambda s: "".join(c for c in s if c not in VOWELS)),
    Op("dup", "str", True, "double each character", '"".join(c * 2 for c in s)', lambda s: "".join(c * 2 for c in s)),
    Op("head", "str", True, "keep the first three characters", "s[:3]", lambda s: s[:3]),
    Op("swap", "str", True, "swap the case", "s.swapcase()", str.swapcase),
    Op("slen", "str", False, "return the length", "len(s)", len),
    Op("vowels", "str", False, "return the number of vowels", 'sum(1 for c in s if c in "aeiou")', _vowel_count),
    Op("spaces", "str", False, "return the number of spaces", 's.count(" ")', lambda s: s.count(" ")),
    Op("words", "str", False, "return the number of words", "len(s.split())", lambda s: len(s.split())),
    Op("pal", "str", False, "return whether it reads the same backwards", "s == s[::-1]", lambda s: s == s[::-1]),
]
BY_KEY = {op.key: op for op in OPS}
ARG = {"list": "xs", "str": "s"}
NOUN = {"list": "a list of integers xs", "str": "a string s"}
HELD_OUT_SHARE = 0.2
NUM_TESTS = 3


def random_input(kind: str, rng: random.Random):
    if kind == "list":
        return [rng.randint(-5, 9) for _ in range(rng.randint(0, 6))]
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        words = [w.capitalize() if rng.random() < 0.5 else w.upper() if rng.random() < 0.3 else w for w in words]
    return " ".join(words)


def name(first: Op, second: Op) -> str:
    return f"{first.key}_{second.key}"


def text(first: Op, second: Op) -> str:
    """The description in words (names the function and its argument, MBPP-style)."""
    then = second.words if not second.transform else f"{second.words} and return the result"
    return (f"Write a function {name(first, second)}({ARG[first.kind]}) that takes {NOUN[first.kind]}: "
            f"{first.words}, then {then}.")


def program(first: Op, second: Op, skip_first: bool = False) -> str:
    """The two-line solution (`skip_first`: the plausible-but-wrong shortcut that forgets the first step)."""
    arg = ARG[first.kind]
    body = "" if skip_first else f"    {arg} = {first.expr}\n"
    return f"def {name(first, second)}({arg}):\n{body}    return {second.expr}\n"


def _asserts(first: Op, second: Op, rng: random.Random, tries: int = 2000) -> list[str] | None:
    """NUM_TESTS asserts of distinct inputs, at least one of which the shortcut fails (None: none found)."""
    for _ in range(tries):
        inputs, seen = [], set()
        while len(inputs) < NUM_TESTS:
            x = random_input(first.kind, rng)
            if repr(x) not in seen:
                seen.add(repr(x))
                inputs.append(x)
        if any(second.fn(first.fn(list(x) if first.kind == "list" else x)) != second.fn(x) for x in inputs):
            f = name(first, second)
            return [f"assert {f}({x!r}) == {second.fn(first.fn(x))!r}" for x in inputs]
    return None


def compositions() -> list[tuple[Op, Op]]:
    """Every (first, second) pair: a transform, then another operation of the same kind."""
    return [(a, b) for a in OPS if a.transform for b in OPS if b.kind == a.kind and b is not a]


def distinguishable(rng: random.Random | None = None) -> list[tuple[Op, Op]]:
    """The compositions whose asserts can tell them apart from the shortcut (fixed seed)."""
    rng = rng or random.Random("code-world-check")
    return [(a, b) for a, b in compositions() if _asserts(a, b, rng, tries=200) is not None]


def split(seed: int = 0) -> tuple[list[tuple[Op, Op]], list[tuple[Op, Op]]]:
    """(train pairs, held-out pairs): HELD_OUT_SHARE of the pairs held out, every op kept in train on both sides."""
    pairs = distinguishable()
    rng = random.Random(f"code-world-split-{seed}")
    order = list(pairs)
    rng.shuffle(order)
    held, train = [], set(pairs)
    target = round(HELD_OUT_SHARE * len(pairs))
    for a, b in order:
        if len(held) >= target:
            break
        rest = train - {(a, b)}
        if any(x is a for x, _ in rest) and any(y is b for _, y in rest):  # both ops still trained there
            train, held = rest, held + [(a, b)]
    return [p for p in pairs if p in train], [p for p in pairs if p not in train]


def row(first: Op, second: Op, rng: random.Random, task_id: str) -> dict:
    tests = _asserts(first, second, rng)
    assert tests is not None, (first.key, second.key)
    return {"task_id": task_id, "text": text(first, second), "test_list": tests,
            "entry_point": name(first, second), "code": program(first, second),
            "composition": f"{first.key}+{second.key}"}


def make_rows(pairs: list[tuple[Op, Op]], per_pair: int, rng: random.Random, prefix: str) -> list[dict]:
    """`per_pair` rows (different asserts) for each pair, in a shuffled order."""
    out = [row(a, b, rng, "") for a, b in pairs for _ in range(per_pair)]
    rng.shuffle(out)
    for i, r in enumerate(out):
        r["task_id"] = f"{prefix}-{i}"
    return out
