"""The `code` task (issue 42): MBPP, HumanEval and stdin/stdout rows from local files, a folder and
the `datasets` loader (pointed at a local folder: nothing downloads); correct code scores 1 and
hostile completions score 0 through the task's reward in the rewards' own process, which reports its
sandbox outcome counts back; a tiny run writes them to metrics.jsonl; the GPU preset validates and plans."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tinyrl.config import RewardSpec, load_config
from tinyrl.data import load_rows
from tinyrl.errors import ConfigError
from tinyrl.rewards.core import RewardSet
from tinyrl.rewards.sandbox import run_tests
from tinyrl.tasks import get_task
from tinyrl.tasks.code import PLAIN_PROMPT, TASK, code_of

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox uses Linux rlimits and namespaces")
FAST = {"cpu_s": 1.0, "wall_s": 2.0, "memory_mb": 256}

MBPP = [  # MBPP `full` rows: text, test_list, test_setup_code
    {"task_id": 11 + k, "text": f"Write a function to add {k} to a number.", "test_setup_code": "OFFSET = 0",
     "test_list": [f"assert add_{k}(1) == {1 + k} + OFFSET", f"assert add_{k}(0) == {k}"]} for k in range(6)
]
SANITIZED = [  # MBPP `sanitized` rows: prompt, test_imports
    {"task_id": 100 + k, "prompt": f"Write a python function to return the square root of {k * k}.",
     "test_imports": ["import math"], "test_list": [f"assert math.isclose(root_{k}(), {k})"]} for k in range(20)
]
HUMANEVAL = [{
    "task_id": "HumanEval/0",
    "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
    "test": "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 2]) == 3\n"
            "    assert candidate([]) == 0\n    assert candidate([5]) == 5\n",
    "entry_point": "total", "canonical_solution": "    return sum(xs)\n",
}]
IO = [{"problem_id": 7, "question": "Read two integers and print their sum.",
       "input_output": json.dumps({"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]})},
      {"problem_id": 8, "question": "Print the input reversed.", "inputs": ["abc\n"], "outputs": ["cba\n"]}]
SUM_PROGRAM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\n"


def score(rows: list[dict], completions: list[str], isolate: bool = True):
    """The task's reward through a RewardSet (by default in the rewards' forked process, as a run calls it)."""
    rs = RewardSet([RewardSpec("task")], task=TASK, timeout=120, isolate=isolate)
    try:
        total, _, report = rs.score([r["prompt"] for r in rows], completions, rows)
    finally:
        rs.close()
    return [None if math.isnan(v) else v for v in total.tolist()], report


@pytest.fixture(scope="module", autouse=True)
def sandbox_runs():
    r = run_tests("def f():\n    return 1\n", ["assert f() == 1"])
    if r.status == "error" and (r.load_error or "").startswith("refused"):
        pytest.skip(f"no mount namespace here, so the sandbox refuses to run: {r.isolation}")


# ----------------------------------------------------------------------------- loading each format


def test_mbpp_rows_from_a_folder_with_a_test_file(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", MBPP[:4])
    write_jsonl(tmp_path / "test.jsonl", MBPP[4:])
    train, held = TASK.build(10, 10, 0, path=str(tmp_path), **FAST)
    assert sorted(r["task_id"] for r in train) == ["11", "12", "13", "14"]
    assert sorted(r["task_id"] for r in held) == ["15", "16"]
    row = next(r for r in train if r["task_id"] == "12")
    assert row["kind"] == "mbpp" and row["entry_point"] == "add_1"  # the function the first assert calls
    assert row["tests"] == ["OFFSET = 0", "assert add_1(1) == 2 + OFFSET", "assert add_1(0) == 1"]
    assert "assert add_1(1) == 2 + OFFSET" in row["prompt"] and "```python" in row["prompt"]
    assert row["prompt"].startswith("Write a function to add 1") and not row["open_fence"]
    good, half = fenced("def add_1(x):\n    return x + 1\n"), fenced("def add_1(x):\n    return 2\n")
    assert score([row] * 3, [good, half, "I cannot do this."])[0] == [1.0, 0.5, 0.0]
    assert TASK.is_correct(good, row) and not TASK.is_correct(half, row)


def test_sanitized_mbpp_from_one_json_file_is_split_by_problem(tmp_path):
    path = tmp_path / "mbpp.json"
    path.write_text(json.dumps(SANITIZED))
    train, held = TASK.build(100, 100, 3, path=str(path), eval_fraction=0.3)
    ids_train, ids_held = {r["task_id"] for r in train}, {r["task_id"] for r in held}
    assert ids_train and ids_held and not ids_train & ids_held and len(ids_train | ids_held) == 20
    assert TASK.build(100, 100, 3, path=str(path), eval_fraction=0.3)[1] == held  # seeded: the same again
    assert {r["task_id"] for r in TASK.build(100, 100, 4, path=str(path), eval_fraction=0.3)[1]} != ids_held
    row = next(r for r in train + held if r["task_id"] == "103")
    assert row["tests"][0] == "import math" and row["entry_point"] == "root_3"
    assert TASK.is_correct(fenced("def root_3():\n    return 3.0\n"), row)


def test_humaneval_rows_inline_check_and_get_the_prompts_imports(tmp_path):
    path = tmp_path / "he.jsonl"
    write_jsonl(path, HUMANEVAL)
    _, held = TASK.build(0, 5, 0, path=str(path), test_path=str(path))
    (row,) = held
    assert row["kind"] == "humaneval" and row["entry_point"] == "total"
    assert "def total(xs: List[int]) -> int:" in row["prompt"] and row["prompt"].count("```") == 3
    # the completion uses List without importing it: the stub's import comes first
    good = fenced("def total(xs: List[int]) -> int:\n    return sum(xs)\n")
    wrong = fenced("def total(xs: List[int]) -> int:\n    return len(xs)\n")
    scores, report = score([row] * 2, [good, wrong])
    assert scores[0] == 1.0 and scores[1] == pytest.approx(1 / 3)  # only [] -> 0 passes
    assert report.tallies["sandbox/pass"] == 1 and report.tallies["sandbox/fail"] == 1


def test_stdin_stdout_rows_from_parquet_and_jsonl(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist([IO[0]]), tmp_path / "train.parquet")
    write_jsonl(tmp_path / "test.jsonl", [IO[1]])
    train, held = TASK.build(5, 5, 0, path=str(tmp_path), reward="all_pass")
    assert [r["kind"] for r in train + held] == ["io", "io"]
    assert "standard input" in train[0]["prompt"]
    first_only = "```python\nprint(3)\n```"  # prints the first case's expected output whatever the input
    assert score([train[0]] * 2, [SUM_PROGRAM, first_only])[0] == [1.0, 0.0]  # all_pass: 1 of 2 cases is 0
    assert TASK.is_correct("```python\nprint(input()[::-1])\n```", held[0])


def test_the_hub_loader_reads_splits_and_names_a_missing_one(tmp_path):
    pytest.importorskip("datasets")
    write_jsonl(tmp_path / "train.jsonl", MBPP[:4])
    write_jsonl(tmp_path / "test.jsonl", MBPP[4:])
    train, held = TASK.build(10, 10, 0, dataset=str(tmp_path))  # any `data.dataset` source: here a local folder
    assert len(train) == 4 and len(held) == 2 and train[0]["kind"] == "mbpp"
    with pytest.raises(ConfigError, match="data.task_args.split: .* no split 'validation'"):
        TASK.build(10, 10, 0, dataset=str(tmp_path), split="validation")


def test_the_shipped_code_world_is_the_default_and_plain_opens_the_fence():
    if not (Path(str(get_task("code").build.__globals__["world_dir"]())) / "train.jsonl").is_file():
        pytest.skip("the shipped code world (issue 42, part 2) is not in this checkout yet")
    train, held = TASK.build(4, 4, 0, template="plain")
    assert len(train) == 4 and len(held) == 4
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in held}
    row = held[0]
    assert row["prompt"] == PLAIN_PROMPT.format(text=row["text"]) and row["open_fence"]
    # a plain completion continues the opened fence: the code is what comes before the closing one
    assert code_of("def f():\n    return 1\n```\nand more", row) == "def f():\n    return 1\n"
    assert code_of("```", row) is None


def test_bad_task_args_name_the_field_and_the_choices(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", MBPP)
    with pytest.raises(ConfigError, match=r"data.task_args.template: must be one of \['default', 'plain'\]"):
        load_config(None, {"data.task": "code", "data.task_args": {"path": str(tmp_path), "template": "chat"}})
    for args, says in [({"reward": "half"}, r"data.task_args.reward: must be one of \['fraction', 'all_pass'\]"),
                       ({"eval_fraction": 1.5}, r"data.task_args.eval_fraction: must be in \[0, 1\)"),
                       ({"prompt": "{question}"}, r"data.task_args.prompt: unknown field 'question'"),
                       ({"path": str(tmp_path / "nope")}, "data.task_args.path: file or folder not found")]:
        with pytest.raises(ConfigError, match=says):
            TASK.build(2, 2, 0, **{"path": str(tmp_path), **args})
    write_jsonl(tmp_path / "bad.jsonl", [{"text": "no tests here"}])
    with pytest.raises(ValueError, match="has no tests: an MBPP row has 'test_list'"):
        TASK.build(2, 2, 0, path=str(tmp_path / "bad.jsonl"))


# ----------------------------------------------------------------------------- hostile completions

ADD = "def add_1(x):\n    return x + 1\n"
WRONG = "def add_1(x):\n    return 0\n"


def hostile(data_file: Path) -> dict[str, str]:
    """Completions that try to pass without solving the problem (each would pass, or hide its failure, if
    the sandbox let it)."""
    return {
        "fork bomb": "import os\nwhile True:\n    os.fork()\n" + ADD,
        "network": "import urllib.request\n"
                   "def add_1(x):\n    return int(urllib.request.urlopen('http://1.1.1.1/?x=%d' % x).read())\n",
        "reads the grader's tests": (
            "import json, re\n"
            f"rows = [json.loads(l) for l in open({str(data_file)!r})]\n"
            "TABLE = {int(a): int(b) for r in rows for t in r['test_list']\n"
            "         for a, b in re.findall(r'add_1\\((\\d+)\\) == (\\d+)', t)}\n"
            "def add_1(x):\n    return TABLE[x]\n"),
        "monkeypatches assert and builtins": (
            "import builtins\n"
            "class Yes(Exception):\n    pass\n"
            "builtins.AssertionError = Yes\n"
            "builtins.isinstance = lambda *a: True\n"
            "import sys\nsys.modules['builtins'].__dict__['abs'] = lambda x: 0\n"
            "class Any:\n    def __eq__(self, o):\n        return True\n"
            "def add_1(x):\n    return Any()\n"),
        "sys.exit(0) before the tests": WRONG + "import sys\nsys.exit(0)\n",
        "os._exit(0) before the tests": WRONG + "import os\nos._exit(0)\n",
        "prints the expected output": WRONG + "print('True\\nTrue\\nall 2 tests passed')\nprint(2)\nprint(1)\n",
        "floods the output": ADD + "print('x' * 10**6)\n",
    }


def test_hostile_completions_score_zero_and_the_counts_come_back_from_the_rewards_process(tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", MBPP)
    train, _ = TASK.build(10, 0, 0, path=str(data), eval_fraction=0.0, **FAST)
    row = next(r for r in train if r["entry_point"] == "add_1")
    attacks = hostile(data)
    completions = [fenced(code) for code in attacks.values()] + [fenced(ADD), "no code at all"]
    scores, report = score([row] * len(completions), completions)  # in the rewards' forked process
    assert dict(zip(attacks, scores)) == dict.fromkeys(attacks, 0.0)
    assert scores[-2:] == [1.0, 0.0]
    assert report.failures == {}  # nothing broke the reward call
    t = report.tallies
    runs = sum(t[f"sandbox/{k}"] for k in ("pass", "fail", "timeout", "crash", "output_limit", "no_code", "error"))
    assert runs == len(completions) and t["sandbox/error"] == 0
    assert t["sandbox/pass"] == 1 and t["sandbox/no_code"] == 1 and t["sandbox/output_limit"] == 1
    assert t["sandbox/exit_call"] == 2 and t["sandbox_time"] > 0
    # all_pass gives the same zeros
    all_pass = [{**row, "all_pass": True}] * len(completions)
    assert score(all_pass, completions, isolate=False)[0][:len(attacks)] == [0.0] * len(attacks)


def test_reward_kwargs_override_the_task_args(tmp_path):
    train, _ = TASK.build(10, 0, 0, path=str(write_jsonl(tmp_path / "t.jsonl", MBPP)), eval_fraction=0.0)
    row = next(r for r in train if r["entry_point"] == "add_1")
    half = fenced("def add_1(x):\n    return 2\n")
    rs = RewardSet([RewardSpec("task", kwargs={"partial": False, "weak_isolation": False})], task=TASK)
    try:
        total, _, report = rs.score([row["prompt"]], [half], [row])
    finally:
        rs.close()
    assert total.tolist() == [0.0] and report.tallies["sandbox/fail"] == 1
    assert score([row], [half])[0] == [0.5]


# ----------------------------------------------------------------------------- a tiny run, the GPU preset


def test_a_tiny_run_writes_sandbox_counts_to_metrics_and_reports_pass_at_k(tmp_path):
    from tinyrl.api import train
    from tinyrl.runs import read_jsonl

    write_jsonl(tmp_path / "train.jsonl", MBPP[:4])
    write_jsonl(tmp_path / "test.jsonl", MBPP[4:])
    run = train(None, **{"model.name": "tiny-arith", "log.run_dir": str(tmp_path / "runs"), "log.progress": False,
                         "data.task": "code",  # a short prompt: the tiny model has 64 positions
                         "data.task_args": {"path": str(tmp_path), "prompt": "{entry_point}=", **FAST},
                         "data.num_train": 4, "data.num_eval": 2, "train.steps": 2, "train.prompts_per_step": 2,
                         "rollout.num_generations": 4, "rollout.max_new_tokens": 8, "train.micro_batch_size": 8,
                         "train.eval_samples": 2, "train.eval_k": [1, 2]})
    rows = read_jsonl(run.path / "metrics.jsonl")
    assert len(rows) == 2
    for m in rows:  # the arithmetic model writes no code block: every completion is counted as no_code
        assert m["sandbox/no_code"] == 8 and m["sandbox/pass"] == 0 and m["sandbox/crash"] == 0
        assert m["sandbox/exit_call"] == 0 and m["sandbox_time"] >= 0 and m["reward_mean"] == 0.0
    assert run.eval_before == 0.0 and run.eval_after == 0.0
    summary = json.loads((run.path / "summary.json").read_text())
    sampled = summary["details"]["eval_sampled"]["after"]  # `tinyrl eval`'s pass@k, with no maj@k for code
    assert sampled["pass@k"] == {"1": 0.0, "2": 0.0} and "no answer_of" in sampled["maj_note"]


def test_the_gpu_preset_validates_and_plans():
    from tinyrl.plan_report import run as plan

    name = "qwen2.5-coder-1.5b-instruct_code_gpu"
    _, cfg = load_config(name, profile="24gb")
    assert cfg.data.task == "code" and cfg.data.task_args["dataset"] == "google-research-datasets/mbpp"
    assert cfg.model.name == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    import inspect

    inspect.signature(TASK.build).bind(1, 1, 0, **cfg.data.task_args)  # every task arg is one the task takes
    for profile in ("16gb", "24gb"):
        p, _ = plan(name, [], profile=profile, search=False)
        assert p.fits and 5 * 2**30 < p.peak < 16 * 2**30, (profile, p.peak / 2**30)


# ----------------------------------------------------------------------------- malformed rows and task args (issue 49)

ROW = {"task_id": 7, "text": "Add one.", "test_list": ["assert add_1(1) == 2"]}


@pytest.mark.parametrize("name, content, says", [
    ("test_list_int.jsonl", [{**ROW, "test_list": 5}], r"row 0 of the training rows \(task_id 7\): 'test_list' must be a list"),
    ("test_list_ints.jsonl", [{**ROW, "test_list": [1, 2]}], r"'test_list' must be a list of strings"),
    ("imports.jsonl", [{**ROW, "test_imports": 5}], r"\(task_id 7\): 'test_imports' must be a list of strings"),
    ("io_list.jsonl", [{"problem_id": 3, "question": "q", "input_output": "[1, 2]"}],
     r"row 0 of the training rows \(task_id 3\): 'input_output' must be \{\"inputs\""),
    ("io_text.jsonl", [{"problem_id": 3, "question": "q", "input_output": "{nope"}], r"'input_output' is not valid JSON"),
    ("io_fn.jsonl", [{"problem_id": 3, "question": "q", "input_output": '{"fn_name": "f", "inputs": [[1]], "outputs": [2]}'}],
     r"call-based APPS rows \(fn_name\) are not supported"),
    ("io_str.jsonl", [{"problem_id": 3, "question": "q", "inputs": "abc", "outputs": "cba"}],
     r"'inputs/outputs': its stdin/stdout cases need as many inputs as outputs"),
    ("test_int.jsonl", [{**{k: v for k, v in ROW.items() if k != "test_list"}, "test": 5}], r"'test' must be a string"),
    ("entry.jsonl", [{**ROW, "entry_point": ["add_1"]}], r"'entry_point' must be a string"),
    ("rows5.json", {"rows": 5}, r"bad.json|must hold a list of rows .*got int 5"),
    ("strings.json", ["a", "b"], r"row 0 must be an object of the row's columns, got str 'a'"),
    ("number.json", 5, r"must hold a list of rows"),
    ("empty.jsonl", [], r"no rows"),
])
def test_a_malformed_row_is_one_clear_error_naming_the_row_and_the_field(tmp_path, name, content, says):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        write_jsonl(path, content)
    else:
        path.write_text(json.dumps(content))
    cfg = load_config(None, {"data.task": "code", "data.task_args": {"path": str(path)}})[1]
    with pytest.raises(ConfigError, match=says):
        load_rows(cfg.data)


def test_a_line_that_is_not_json_and_a_fifo_are_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"rows.jsonl, line 2: not valid JSON"):
        TASK.build(2, 2, 0, path=str(path))
    fifo = tmp_path / "fifo.jsonl"
    import os

    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file or a folder"):  # never a read that blocks
        TASK.build(2, 2, 0, path=str(fifo))


def test_a_malformed_code_dataset_exits_2_from_the_cli_and_writes_nothing(tmp_path, capsys):
    from tinyrl.cli import main

    (tmp_path / "bad.json").write_text(json.dumps({"rows": 5}))
    rc = main(["train", "model.name=tiny-arith", "train.steps=1", "log.progress=false", "data.task=code",
               f"data.task_args.path={tmp_path / 'bad.json'}", f"log.run_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "must hold a list of rows" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_a_test_list_given_as_one_string_is_one_test(tmp_path):
    """Not one test per character: the string is the test code (it may hold several statements)."""
    path = write_jsonl(tmp_path / "one.jsonl", [{**ROW, "test_list": "assert add_1(1) == 2\nassert add_1(5) == 6"}])
    (row,) = TASK.build(5, 0, 0, path=str(path), eval_fraction=0.0, **FAST)[0]
    assert row["tests"] == ["assert add_1(1) == 2\nassert add_1(5) == 6"] and row["entry_point"] == "add_1"
    assert score([row] * 2, [fenced(ADD), fenced("def add_1(x):\n    return 2\n")])[0] == [1.0, 0.5]


def test_rows_whose_tests_cannot_run_are_named_once_and_left_out(tmp_path, caplog):
    rows = [{**ROW, "task_id": 10 + k, "test_list": [f"assert add_1({k}) == {k + 1}"]} for k in range(4)]
    rows[1]["test_list"] = ["assert add_1(1 == 2"]  # a syntax error
    rows[3]["test_list"] = ["x = 1"]  # nothing asserted: every sample would score 0
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with caplog.at_level("WARNING", logger="tinyrl.tasks.code"):
        train, _ = TASK.build(10, 0, 0, path=str(path), eval_fraction=0.0)
    assert sorted(r["task_id"] for r in train) == ["10", "12"]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "2 of 4 training rows have tests the grader cannot run" in warning
    assert "row 1 (task_id 11): SyntaxError" in warning and "row 3 (task_id 13): no check" in warning
    write_jsonl(path, [rows[1]])
    with pytest.raises(ConfigError, match="no training row has tests the grader can run"):
        TASK.build(10, 0, 0, path=str(path), eval_fraction=0.0)


@pytest.mark.parametrize("args, says", [
    ({"memory_mb": 0}, r"data.task_args.memory_mb: must be an integer from 64 to 65536 \(MiB\), got 0"),
    ({"memory_mb": "lots"}, r"data.task_args.memory_mb: must be an integer .* got 'lots'"),
    ({"memory_mb": 10**12}, r"data.task_args.memory_mb: must be an integer from 64 to 65536"),
    ({"memory_mb": 512.5}, r"data.task_args.memory_mb: must be an integer"),
    ({"wall_s": -1}, r"data.task_args.wall_s: must be a number from 0.1 to 3600.0 \(seconds\), got -1"),
    ({"wall_s": float("nan")}, r"data.task_args.wall_s: must be a number"),
    ({"cpu_s": 1e9}, r"data.task_args.cpu_s: must be a number from 0.1 to 3600.0"),
    ({"cpu_s": True}, r"data.task_args.cpu_s: must be a number"),
    ({"weak_isolation": "yes"}, r"data.task_args.weak_isolation: must be true or false"),
    ({"eval_fraction": "0.1"}, r"data.task_args.eval_fraction: must be in \[0, 1\)"),
    ({"split": ""}, r"data.task_args.split: must be a non-empty string"),
    ({"path": 5}, r"data.task_args.path: must be a non-empty string or null"),
    ({"prompt": "{text.__class__.__mro__}"}, r"data.task_args.prompt: unknown field 'text.__class__.__mro__'"),
    ({"prompt": "{text:>2000000000}"}, r"data.task_args.prompt: '\{text:>2000000000\}' is not allowed"),
    ({"prompt": "{text[0]}"}, r"data.task_args.prompt: unknown field 'text\[0\]'"),
    ({"prompt": "{text!r}"}, r"data.task_args.prompt: '\{text!r\}' is not allowed"),
    ({"prompt": "{text"}, r"data.task_args.prompt: not a valid format string"),
    ({"timeout": 3}, r"data.task_args: the code task does not take \['timeout'\]; it takes \['path'"),
])
def test_bad_task_args_are_refused_before_anything_runs_naming_the_setting_and_its_range(tmp_path, args, says):
    from tinyrl.tasks.code import check_args

    with pytest.raises(ConfigError, match=says):
        check_args(args)
    if "timeout" not in args:  # build checks them too, before reading any data
        with pytest.raises(ConfigError, match=says):
            TASK.build(2, 2, 0, **{"path": str(tmp_path / "never-read.jsonl"), **args})
    check_args({"memory_mb": 64, "wall_s": 0.5, "cpu_s": 3600, "prompt": "{text} {{literal}} {example}"})  # in range
