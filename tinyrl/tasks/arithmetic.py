"""The built-in "arithmetic" task: add two numbers, verified exactly. tinyrl's embedded default.

A prompt is the raw sum `"37+48="` (no chat template, no spaces) and a correct completion
is the answer's digits, `"85"`, ending there: the shipped tiny model (assets/tiny-arith)
stops with its EOS token, a general LM can stop at a newline (`stop=["\\n"]`), so one
trailing newline is allowed. Anything else is wrong: spaces, leading zeros, a second
answer, words.

Held-out problems never appear in training rows, whatever the seed: a fixed hash of the
pair `(a, b)` puts about 10% of all problems in the held-out pool (`is_held_out`), the rest
in the train pool, and `build` draws from each pool. scripts/pretrain_tiny.py uses the same
rule to keep the held-out pool out of the tiny model's pretraining text.

Task args: `digits` (default 2), the number of digits of each operand.
"""

from __future__ import annotations

import random
import zlib

from tinyrl.tasks.base import Task

END = "\n"  # the one optional end marker a completion may keep (a stop string)
HELD_OUT_PERCENT = 10  # share of all problems in the held-out pool
_ENUMERATE_LIMIT = 1_000_000  # pools up to this size are listed; larger ones are sampled


def is_held_out(a: int, b: int) -> bool:
    """Whether `a+b` belongs to the held-out pool (a fixed hash, independent of any seed)."""
    return zlib.crc32(f"{a}+{b}".encode()) % 100 < HELD_OUT_PERCENT


def has_carry(a: int, b: int) -> bool:
    """Whether column addition of a and b carries anywhere (some digit pair sums to >= 10)."""
    while a or b:
        if a % 10 + b % 10 >= 10:  # the first carry needs no incoming one
            return True
        a, b = a // 10, b // 10
    return False


def carryless_sum(a: int, b: int) -> int:
    """Column addition that drops every carry: each digit is (digit_a + digit_b) mod 10.

    >>> carryless_sum(37, 48), carryless_sum(57, 68), carryless_sum(12, 34)
    (75, 15, 46)
    """
    out, place = 0, 1
    while a or b:
        out += (a % 10 + b % 10) % 10 * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def make_row(a: int, b: int) -> dict:
    return {"prompt": f"{a}+{b}=", "answer": str(a + b), "a": a, "b": b, "carry": has_carry(a, b)}


def operand_range(digits: int) -> range:
    """Operands with exactly `digits` digits (1-9 for one digit)."""
    return range(1 if digits == 1 else 10 ** (digits - 1), 10**digits)


def _draw(rng: random.Random, digits: int, held_out: bool, n: int) -> list[tuple[int, int]]:
    """n distinct pairs from one pool, in a seeded random order."""
    ops = operand_range(digits)
    if len(ops) ** 2 <= _ENUMERATE_LIMIT:
        pool = [(a, b) for a in ops for b in ops if is_held_out(a, b) == held_out]
        if n > len(pool):
            which = "num_eval" if held_out else "num_train"
            raise ValueError(f"arithmetic: {which}={n} exceeds the {len(pool)} {digits}-digit problems in that pool")
        return rng.sample(pool, n)
    seen: dict[tuple[int, int], None] = {}
    while len(seen) < n:
        pair = (rng.choice(ops), rng.choice(ops))
        if is_held_out(*pair) == held_out:
            seen[pair] = None
    return list(seen)


def build(num_train: int, num_eval: int, seed: int = 0, digits: int = 2) -> tuple[list[dict], list[dict]]:
    """(train_rows, eval_rows): distinct `digits`-digit sums, disjoint pools, deterministic for a seed."""
    if not 1 <= digits <= 9:
        raise ValueError(f"arithmetic: digits must be in 1..9, got {digits}")
    # one random stream per pool: the held-out rows of a seed do not depend on num_train
    train = _draw(random.Random(f"arithmetic-train-{seed}-{digits}"), digits, False, num_train)
    held = _draw(random.Random(f"arithmetic-eval-{seed}-{digits}"), digits, True, num_eval)
    return [make_row(a, b) for a, b in train], [make_row(a, b) for a, b in held]


def is_correct(completion: str, row: dict) -> bool:
    """Exactly the answer's digits, optionally followed by one newline; nothing else.

    >>> row = {"answer": "85"}
    >>> is_correct("85", row), is_correct("85\\n", row)
    (True, True)
    >>> is_correct("75", row), is_correct(" 85", row), is_correct("085", row), is_correct("85\\n\\n", row)
    (False, False, False, False)
    >>> is_correct("85 86", row), is_correct("85\\n86", row), is_correct("8 5", row), is_correct("", row)
    (False, False, False, False)
    """
    return answer_of(completion, row) == str(row["answer"])


def answer_of(completion: str, row: dict) -> str | None:
    """The completion as an answer to vote on (maj@k): its text without the one optional newline;
    None for an empty one. Exactly what `is_correct` compares with the answer.

    >>> answer_of("85\\n", {}), answer_of(" 85", {}), answer_of("", {})
    ('85', ' 85', None)
    """
    text = completion[: -len(END)] if completion.endswith(END) else completion
    return text or None


TASK = Task(
    name="arithmetic",
    description="add two numbers (`digits` digits each, default 2): prompt '37+48=', answer '85'",
    build=build,
    is_correct=is_correct,
    stop=[END],
    answer_of=answer_of,
)
