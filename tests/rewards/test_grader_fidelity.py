"""The grader's fidelity (issue 49): every correct MBPP / HumanEval reference solution passes the sandbox's
judge, every wrong body fails, and a value that lies about itself (`__eq__` always True) passes nothing.

The fixtures under tests/data/code_idioms/ are rows shaped like the real ones (MBPP `mbpp.jsonl`, the
sanitized `sanitized-mbpp.json`, `HumanEval.jsonl`), one per idiom the judge once failed: a returned
Counter (MBPP 40, 88, 902), a defaultdict (653), an assert on a returned re.Match (sanitized 737, 787,
794), a type passed as an argument (533), a tree the test builds by setting attributes on the solution's
class (367, 927), a function named like a builtin (126), and HumanEval tests that call the prompt's
helpers; each row carries its reference solution and a wrong body (`wrong_code` / `wrong_solution`).
`forged.jsonl` holds solutions that try to pass those checks with lying values.

The real sets: point TINYRL_CODE_SETS at a folder holding any of `mbpp.jsonl`, `sanitized-mbpp.json`,
`HumanEval.jsonl(.gz)` (as released) and run `pytest -m slow tests/rewards/test_grader_fidelity.py`,
or `python tests/rewards/test_grader_fidelity.py FOLDER` for the counts.
"""

from __future__ import annotations

import collections
import decimal
import fractions
import gzip
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tinyrl.rewards._sandbox_values import MatchCopy, decode, encode
from tinyrl.rewards.sandbox import Limits, judge, parse_tests, run_tests
from tinyrl.tasks.code import normalize

FIXTURES = Path(__file__).parents[1] / "data" / "code_idioms"
REAL_SETS = "TINYRL_CODE_SETS"
LIMITS = Limits(cpu_s=2, wall_s=10)
SLOW: dict[str, str] = {}  # "<set>/<task_id>" of a reference slower than the limits in plain Python: why


def load_sets(folder: Path) -> list[tuple[str, dict, str, str | None]]:
    """(name, normalised row, reference code, wrong code or None) of every row of the sets in `folder`."""
    out = []
    for name in ("mbpp.jsonl", "sanitized-mbpp.json", "HumanEval.jsonl", "HumanEval.jsonl.gz"):
        path = folder / name
        if not path.is_file():
            continue
        text = gzip.decompress(path.read_bytes()).decode() if name.endswith(".gz") else path.read_text()
        raws = json.loads(text) if name.endswith(".json") else [json.loads(ln) for ln in text.splitlines() if ln.strip()]
        short = name.split(".")[0]
        for k, raw in enumerate(raws):
            row = normalize(raw, f"{name} row {k}")
            if row["kind"] == "humaneval":
                ref = raw["prompt"] + raw["canonical_solution"]
                wrong = raw["prompt"] + raw["wrong_solution"] if "wrong_solution" in raw else None
            else:
                ref, wrong = raw["code"], raw.get("wrong_code")
            out.append((f"{short}/{raw['task_id']}", row, ref, wrong))
    return out


def run_row(row: dict, code: str):
    return run_tests(row["code_prefix"] + code, row["tests"], row["entry_point"], LIMITS)


def check_sandbox():
    r = run_tests("def f():\n    return 1\n", ["assert f() == 1"])
    if r.status == "error":
        pytest.skip(f"the sandbox cannot run here: {r.load_error}")


ROWS = load_sets(FIXTURES)
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox uses Linux rlimits and namespaces")


def test_the_fixtures_cover_every_idiom_of_the_issue():
    names = {name for name, *_ in ROWS}
    assert {f"mbpp/{t}" for t in (40, 88, 126, 367, 533, 653, 902, 927)} <= names
    assert {f"sanitized-mbpp/{t}" for t in (737, 787, 794)} <= names
    assert all(wrong for *_, wrong in ROWS)  # each row has a wrong body


@pytest.mark.parametrize("name, row, ref, wrong", ROWS, ids=[r[0] for r in ROWS])
def test_the_reference_passes_and_the_wrong_body_fails(name, row, ref, wrong):
    check_sandbox()
    good = run_row(row, ref)
    assert good.status == "ok" and all(good.passed), (name, good)
    bad = run_row(row, wrong)
    assert bad.score < 1.0, (name, bad)


FORGED = [json.loads(ln) for ln in (FIXTURES / "forged.jsonl").read_text().splitlines() if ln.strip()]


@pytest.mark.parametrize("forged", FORGED, ids=[f"{f['task_id']}-{f['why'][:30]}" for f in FORGED])
def test_a_value_that_lies_about_itself_passes_nothing(forged):
    """Subclasses of Counter, dict, defaultdict, list, int and float with `__eq__` always True, a `__class__`
    that claims Counter, an object that flips its truth, a metaclass: each is a handle, equal to nothing."""
    check_sandbox()
    (row,) = [r for name, r, *_ in ROWS if name.split("/")[1] == str(forged["task_id"])][:1]
    r = run_row(row, forged["code"])
    assert not any(r.passed), (forged["why"], r)


def test_solution_objects_give_values_never_verdicts():
    """A handle (an object of the solution) is iterated, measured, printed, indexed and has attributes set in
    the worker; the judge compares what comes back with its own code: `in`, `==` and truth are never asked of it."""
    check_sandbox()
    code = ("class Bag:\n    def __init__(self):\n        self.items = [3, 1, 2]\n"
            "    def __iter__(self):\n        return iter(self.items)\n    def __len__(self):\n        return len(self.items)\n"
            "    def __getitem__(self, i):\n        return self.items[i]\n    def __str__(self):\n        return 'bag'\n"
            "    def __eq__(self, other):\n        return True\n    def __contains__(self, x):\n        return True\n"
            "    def __bool__(self):\n        return True\n"
            "def bag():\n    return Bag()\ndef gen(n):\n    return (i * i for i in range(n))\n")
    tests = ["b = bag()", "b.items = [5, 6]", "assert sorted(bag()) == [1, 2, 3]", "assert len(bag()) == 3",
             "assert str(bag()) == 'bag'", "assert bag()[0] == 3", "assert list(gen(3)) == [0, 1, 4]",
             "assert list(b) == [5, 6]", "assert 2 in bag()",
             # the verdicts the object would forge: `==`, `in` (its __contains__), truth
             "assert bag() == [1]", "assert 9 in bag()", "assert bag()", "assert not bag()"]
    r = run_tests(code, tests, limits=LIMITS)
    assert r.status == "ok" and r.passed == [True] * 7 + [False] * 4, r


def test_values_are_rebuilt_from_the_receivers_own_classes():
    counts = collections.Counter("abca")
    assert decode(encode(counts)) == {"a": 2, "b": 1, "c": 1} and type(decode(encode(counts))) is collections.Counter
    dd = collections.defaultdict(list, {"x": [1]})
    back = decode(encode(dd))
    assert back == {"x": [1]} and back.default_factory is list and back["new"] == []
    assert decode(encode(collections.defaultdict(lambda: 0, {"y": 1}))).default_factory is None  # a lambda is dropped
    od = collections.OrderedDict([("b", 1), ("a", 2)])
    assert decode(encode(od)) == od and decode(encode(od)) != collections.OrderedDict([("a", 2), ("b", 1)])
    for v in (collections.deque([1, 2], maxlen=3), fractions.Fraction(1, 3), decimal.Decimal("1.10"), range(1, 9, 2),
              bytearray(b"ab"), (1, frozenset({2}), {3: b"x"}), 2 + 3j, int, collections.Counter, decimal.Decimal,
              7 ** 20000, -(7 ** 20000)):  # past JSON's int-string limit: in hex
        assert decode(encode(v)) == v and type(decode(encode(v))) is type(v), v
    m = re.search(r"(?P<a>a)(b)?(c)", "xxac")
    copy = decode(encode(m))
    assert type(copy) is MatchCopy and copy and copy.group() == "ac" and copy.span() == (2, 4)
    assert copy.groups() == ("a", None, "c") and copy.groupdict() == {"a": "a"} and copy["a"] == "a"
    assert copy.group(1, 3) == ("a", "c") and copy.start(3) == 3 and repr(copy) == repr(m)
    assert copy != decode(encode(m))  # a Match equals only itself
    with pytest.raises(TypeError):
        encode(type("Mine", (dict,), {})())  # a subclass is not data
    with pytest.raises(TypeError):
        encode(lambda: 0)


@pytest.mark.parametrize("bad", [{"Y": "os:system"}, {"Y": "builtins:_private"}, {"Y": "builtins:len"}, {"R": [1, "x"]},
                                 {"CT": [[1]]}, {"M": ["ab", 0, 2, [[0, 9]], {}, None, None]}, {"Q": 1}, {"L": 5},
                                 {"D": [], "L": []}, {"DD": [{"Y": "builtins:print"}, []]}])
def test_malformed_or_hostile_data_is_refused(bad):
    with pytest.raises((ValueError, TypeError, KeyError)):
        decode(bad)


def test_the_host_compares_counters_matches_and_types_faithfully():
    """The host's literal checks see the same rebuilt values: a Counter equals its dict; a Match is true."""
    (check,) = parse_tests(["assert freq([1, 1]) == {1: 2}"])[1]
    assert judge(check, {"i": 0, "v": encode(collections.Counter([1, 1]))})
    assert not judge(check, {"i": 0, "v": encode(collections.Counter([1]))})
    assert not judge(check, {"i": 0, "v": {"R": [3, "Counterish"]}})  # an object of the solution
    truthy, falsy = parse_tests(["assert m('a')", "assert not m('b')"])[1]
    match = encode(re.match("a", "a"))
    assert judge(truthy, {"i": 0, "v": match}) and not judge(falsy, {"i": 1, "v": match})


def test_a_function_named_like_a_builtin_is_the_entry_point():
    row = normalize({"task_id": 126, "text": "Sum of common divisors.", "test_list": ["assert sum(10,15) == 6"]}, "row 0")
    assert row["entry_point"] == "sum"
    row = normalize({"task_id": 1, "text": "t", "test_list": ["assert len(pairs([1, 2])) == 1"]}, "row 0")
    assert row["entry_point"] == "pairs"


def count_reference_passes(folder: Path, workers: int = 2) -> dict[str, dict]:
    """Per set: rows, reference passes, and the names of the references that fail (with why)."""
    rows = load_sets(folder)

    def one(item):
        name, row, ref, _ = item
        r = run_row(row, ref)
        return name, r.status == "ok" and all(r.passed), f"{r.status}: {r.load_error or r.passed}"

    counts: dict[str, dict] = {}
    with ThreadPoolExecutor(workers) as ex:
        for name, ok, why in ex.map(one, rows):
            c = counts.setdefault(name.split("/")[0], {"rows": 0, "pass": 0, "failing": {}})
            c["rows"] += 1
            c["pass"] += ok
            if not ok:
                c["failing"][name] = why
    return counts


@pytest.mark.slow
def test_every_real_reference_solution_passes():
    folder = os.environ.get(REAL_SETS)
    if not folder:
        pytest.skip(f"set {REAL_SETS} to a folder holding mbpp.jsonl, sanitized-mbpp.json and/or HumanEval.jsonl(.gz) "
                    "(the real sets cannot be fetched here)")
    counts = count_reference_passes(Path(folder))
    if not counts:
        pytest.skip(f"{folder} holds none of mbpp.jsonl, sanitized-mbpp.json, HumanEval.jsonl(.gz)")
    failing = {name: why for c in counts.values() for name, why in c["failing"].items() if name not in SLOW}
    assert failing == {}, {s: (c["pass"], c["rows"]) for s, c in counts.items()}


if __name__ == "__main__":  # python tests/rewards/test_grader_fidelity.py FOLDER: the counts, as JSON
    print(json.dumps(count_reference_passes(Path(sys.argv[1])), indent=1))
