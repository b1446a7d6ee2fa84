"""Data from anywhere: `data.dataset` as a jsonl / parquet / csv file, a save_to_disk folder, or a hub id
read offline from a hub cache the test lays out by hand; and the errors a wrong column, split or file gives.

Every dataset here is written by the test with `datasets` (nothing downloads): the hub-id cases run
`tinyrl` in a subprocess with HF_HUB_OFFLINE=1 and HF_HUB_CACHE / HF_DATASETS_CACHE in the test's
folder, exactly as a user's offline run would.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from tinyrl.config import load_config  # noqa: E402
from tinyrl.data import load_rows  # noqa: E402
from tinyrl.errors import ConfigError  # noqa: E402
from tinyrl.rewards.math import last_number  # noqa: E402
from tinyrl.runs import read_jsonl  # noqa: E402
from tinyrl.tasks.dataset import ANSWER_EXTRACTORS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = {"model.name": "tiny-arith", "train.steps": 2, "train.prompts_per_step": 2, "rollout.num_generations": 2,
        "train.micro_batch_size": 4, "train.eval_before_after": False, "log.progress": False,
        "data.num_train": 16, "data.num_eval": 4, "rollout.max_new_tokens": 6,
        "reward.functions": [{"name": "task"}, {"name": "math_lenient"}]}
_rng = random.Random(0)
SUMS = [(_rng.randint(10, 49), _rng.randint(10, 49)) for _ in range(60)]
ROWS = [{"question": f"{a}+{b}=", "answer": f"{a} and {b} make {a + b}.\n#### {a + b}", "a": a, "b": b,
         "total": a + b} for a, b in SUMS]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """`datasets` writes its arrow cache in the test's folder, not ~/.cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


def data_cfg(**over):
    return load_config(None, {"data.num_train": 1000, "data.num_eval": 1000, **over})[1].data


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_saved(path):
    """A save_to_disk DatasetDict with a train and a test split (no question column: a template writes it)."""
    cols = [{k: r[k] for k in ("a", "b", "total")} for r in ROWS]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(cols[:50]),
                          "test": datasets.Dataset.from_list(cols[50:])}).save_to_disk(str(path))
    return path


def hub_cache(root: Path, repo: str, files: dict[str, str]) -> Path:
    """A dataset repo laid out as huggingface_hub's cache: datasets--owner--name/snapshots/<sha>/... + refs/main."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    folder = root / f"datasets--{repo.replace('/', '--')}"
    for name, text in files.items():
        (folder / "snapshots" / sha / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "snapshots" / sha / name).write_text(text)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(sha)
    return root


def offline_env(tmp_path):
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"),
            "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache"), "PYTHONPATH": str(REPO)}


def lenient_right(completion: str, gold: str) -> float:
    n = last_number(completion)
    return float(n is not None and float(n) == float(gold))


def check_run(run_dir: Path, prompts: set[str], gold: dict[str, str]):
    """Both steps ran, on the dataset's prompts, and the lenient math reward matches the rows' gold answers."""
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert samples and {s["prompt"] for s in samples} <= prompts
    for s in samples:  # the gold answer travelled from the dataset's answer column to the reward
        assert s["reward/math_lenient"] == lenient_right(s["completion"], gold[s["prompt"]]), s
    assert any(s["reward/math_lenient"] == 1.0 for s in samples)  # not vacuous: some answers were right


# --- end to end: the tiny model trains on each kind of source ------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "csv", "save_to_disk"])
def test_trains_end_to_end_from_a_local_dataset(tmp_path, kind):
    import tinyrl

    over = {"data.columns": {"prompt": "question"}}
    if kind == "jsonl":
        source = write_jsonl(tmp_path / "d.jsonl", ROWS)
    elif kind == "parquet":
        source = tmp_path / "d.parquet"
        datasets.Dataset.from_list(ROWS).to_parquet(str(source))
    elif kind == "csv":
        source = tmp_path / "d.csv"
        datasets.Dataset.from_list(ROWS).to_csv(str(source), index=False)
    else:  # the prompt from a template over int columns, the gold from a plain int column, a test split
        source = write_saved(tmp_path / "saved")
        over = {"data.prompt_template": "{a}+{b}=", "data.columns": {"answer": "total"},
                "data.answer_extractor": "plain", "data.eval_split": "test", "train.eval_before_after": True}
    run = tinyrl.train("tiny_grpo_cpu", **{**TINY, **over, "data.dataset": str(source),
                                           "log.run_dir": str(tmp_path / "runs")})
    if kind == "save_to_disk":  # held-out accuracy by the dataset task's verifier, on the test split
        assert 0.0 <= run.eval_before <= 1.0 and 0.0 <= run.eval_after <= 1.0
    check_run(run.path, {r["question"] for r in ROWS}, {r["question"]: str(r["total"]) for r in ROWS})


@pytest.mark.slow  # a fresh process (torch, transformers, datasets imports): ~30 s on 2 busy cores
def test_hub_id_trains_offline_from_the_hub_cache(tmp_path):
    """`data.dataset: owner/name` with HF_HUB_OFFLINE=1 reads the snapshot that `hf download` leaves in the
    hub cache (laid out here by hand), through the CLI in a fresh process."""
    train, test = ROWS[:50], ROWS[50:]
    hub_cache(tmp_path / "hub", "someone/sums", {
        "data/train.jsonl": "".join(json.dumps(r) + "\n" for r in train),
        "data/test.jsonl": "".join(json.dumps(r) + "\n" for r in test)})
    args = [f"{k}={json.dumps(v)}" for k, v in TINY.items()]
    cmd = [sys.executable, "-m", "tinyrl.cli", "train", "tiny_grpo_cpu", *args, "data.dataset=someone/sums",
           "data.eval_split=test", "data.columns={prompt: question}", f"log.run_dir={tmp_path / 'runs'}",
           "log.name=hub"]
    p = subprocess.run(cmd, cwd=tmp_path, env=offline_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    check_run(tmp_path / "runs" / "hub", {r["question"] for r in train}, {r["question"]: str(r["total"]) for r in ROWS})
    assert any((tmp_path / "datasets-cache").iterdir())  # the env's datasets cache, not ~/.cache


GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
"""

PROBE = """
import json, sys
from tinyrl.config import load_config
from tinyrl.data import load_rows
out = {}
for name, over in json.loads(sys.argv[1]).items():
    try:
        train, held, task = load_rows(load_config(None, over)[1].data)
        out[name] = {"train": [r["question"] for r in train], "held": [r["question"] for r in held],
                     "gold": [r["gold"] for r in train], "task": task.name if task else None}
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(out))
"""


def test_gsm8k_task_loads_openai_gsm8k_by_hub_id_offline(tmp_path):
    """The built-in gsm8k task with no path reads openai/gsm8k (config main) from the hub cache offline; a
    dataset that is not cached says how to download it (with a command that exists: `hf download`)."""
    def jl(rows):
        return "".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in rows)

    hub_cache(tmp_path / "hub", "openai/gsm8k", {"README.md": GSM8K_README, "main/train-00000-of-00001.jsonl": jl(ROWS[:40]),
                                                 "main/test-00000-of-00001.jsonl": jl(ROWS[40:])})
    cases = {"gsm8k": {"data.task": "gsm8k", "data.num_train": 30, "data.num_eval": 5},
             "generic": {"data.dataset": "openai/gsm8k", "data.config": "main", "data.eval_split": "test",
                         "data.columns": {"prompt": "question"}, "data.answer_extractor": "gsm8k"},
             "no_config": {"data.dataset": "openai/gsm8k", "data.config": "socratic"},
             "not_cached": {"data.dataset": "someone/else"},
             "gsm8k_not_cached": {"data.task": "gsm8k", "data.task_args": {"dataset": "someone/else"}}}
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], cwd=tmp_path, env=offline_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    g = out["gsm8k"]
    assert g["task"] == "gsm8k" and len(g["train"]) == 30 and len(g["held"]) == 5, out
    assert set(g["held"]) <= {r["question"] for r in ROWS[40:]} and set(g["train"]) <= {r["question"] for r in ROWS[:40]}
    gen = out["generic"]
    assert gen["task"] == "dataset" and sorted(gen["train"]) == sorted(r["question"] for r in ROWS[:40])
    assert set(gen["held"]) == {r["question"] for r in ROWS[40:]}
    assert all(gd == str(eval(q[:-1])) for q, gd in zip(gen["train"], gen["gold"]))  # the #### numbers
    assert "data.config" in out["no_config"]["error"] and "main" in out["no_config"]["error"], out
    for name, field in (("not_cached", "data.dataset"), ("gsm8k_not_cached", "data.task_args.dataset")):
        err = out[name]["error"]
        assert "ConfigError" in err and field in err and "hf download someone/else --repo-type dataset" in err, err


# --- rows: splits, columns, templates, extractors ----------------------------------------------------


def test_rows_split_seeded_and_disjoint_and_the_verifier_reads_gold(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", ROWS)
    cfg = data_cfg(**{"data.dataset": str(f), "data.columns": {"prompt": "question"}, "data.eval_fraction": 0.2})
    assert cfg.task == "dataset"  # data.dataset given, data.task left at its default
    train, held, task = load_rows(cfg)
    assert len(train) == 48 and len(held) == 12
    assert {r["question"] for r in train}.isdisjoint(r["question"] for r in held)
    assert [r["question"] for r in load_rows(cfg)[0]] == [r["question"] for r in train]  # seeded
    other = load_rows(data_cfg(**{"data.dataset": str(f), "data.columns": {"prompt": "question"}, "data.seed": 1}))[0]
    assert [r["question"] for r in other] != [r["question"] for r in train]
    r = train[0]
    assert r["prompt"] == r["question"] and r["gold"] == str(r["total"]) and r["a"] + r["b"] == r["total"]
    assert task.is_correct(f"so \\boxed{{{r['gold']}}}", r) and not task.is_correct(f"\\boxed{{{r['gold']}1}}", r)
    cols = {k: [x[k] for x in train[:3]] for k in train[0]}
    got = task.reward(cols["prompt"], [f"#### {train[0]['gold']}", f"\\boxed{{{train[1]['gold']}.0}}", "7"], **cols)
    assert got == [1.0, 1.0, 0.0]


def test_no_held_out_rows_when_num_eval_is_zero(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", ROWS)
    train, held, _ = load_rows(data_cfg(**{"data.dataset": str(f), "data.columns": {"prompt": "question"},
                                           "data.num_eval": 0, "train.eval_before_after": False}))
    assert len(train) == len(ROWS) and held == []


@pytest.mark.parametrize("extractor,answer,gold", [
    ("gsm8k", "6 * 7 = 42\n#### 42", "42"),
    ("boxed", "so $x = \\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
    ("plain", " 3/4 ", "3/4"),
    ("auto", "#### 1,200", "1200"),
    ("auto", "\\boxed{7}", "7"),
    ("auto", "7", "7"),
])
def test_answer_extractors(tmp_path, extractor, answer, gold):
    f = write_jsonl(tmp_path / "d.jsonl", [{"problem": "q", "solution": answer}] * 5)
    train, _, task = load_rows(data_cfg(**{"data.dataset": str(f), "data.columns": {"prompt": "problem"},
                                           "data.answer_extractor": extractor, "data.num_eval": 0,
                                           "train.eval_before_after": False}))
    assert train[0]["gold"] == gold and train[0]["answer"] == gold  # `answer` added for the math_* rewards
    assert task.is_correct(f"The answer is \\boxed{{{gold}}}", train[0])


def test_extractor_choices_are_the_registry():
    from typing import get_args, get_type_hints

    from tinyrl.config.schema import DataConfig

    assert set(get_args(get_type_hints(DataConfig)["answer_extractor"])) == set(ANSWER_EXTRACTORS)


def test_message_list_prompts_and_no_answer_column(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"say {i}"}], "id": i} for i in range(10)]
    f = write_jsonl(tmp_path / "d.jsonl", rows)
    train, held, task = load_rows(data_cfg(**{"data.dataset": str(f)}))
    assert task is None  # no answer column: rewards come from the user's functions
    assert sorted(r["prompt"] for r in train + held) == sorted(f"say {i}" for i in range(10))
    assert all(r["prompt"] == f"say {r['id']}" for r in train)
    f = write_jsonl(tmp_path / "code.jsonl", [{"prompt": "write f", "solution": "def f(): pass"}] * 5)
    train, _, task = load_rows(data_cfg(**{"data.dataset": str(f), "data.columns": {"answer": None}}))
    assert task is None and train[0]["solution"] == "def f(): pass" and "gold" not in train[0]
    train, _, task = load_rows(data_cfg(**{"data.dataset": str(f)}))  # found by its name: a gold answer
    assert task is not None and train[0]["gold"] == "def f(): pass"


def test_a_hub_style_folder_with_configs(tmp_path):
    folder = tmp_path / "gsm8k"
    (folder / "main").mkdir(parents=True)
    (folder / "README.md").write_text(GSM8K_README)
    write_jsonl(folder / "main" / "train-00000-of-00001.jsonl", ROWS[:40])
    write_jsonl(folder / "main" / "test-00000-of-00001.jsonl", ROWS[40:])
    over = {"data.dataset": str(folder), "data.config": "main", "data.eval_split": "test",
            "data.prompt_template": "Q: {question}", "data.num_eval": 3}
    train, held, task = load_rows(data_cfg(**over))
    assert len(train) == 40 and len(held) == 3 and train[0]["prompt"] == "Q: " + train[0]["question"]
    assert task.name == "dataset"


# --- what a wrong field says ---------------------------------------------------------------------


@pytest.mark.parametrize("over,words", [
    ({"data.columns": {"prompt": "query"}}, ["data.columns.prompt", "'query'", "'question'", "'answer'"]),
    ({}, ["data.columns.prompt (default: data.prompt_column)", "'prompt'", "its columns"]),
    ({"data.columns": {"prompt": "question", "answer": "sol"}}, ["data.columns.answer", "'sol'", "'total'"]),
    ({"data.prompt_template": "{question} {level}"}, ["data.prompt_template", "['level']", "'question'"]),
    ({"data.columns": {"prompt": "question"}, "data.split": "validation"}, ["data.split", "'validation'", "['train']"]),
    ({"data.columns": {"prompt": "question"}, "data.eval_split": "test"}, ["data.eval_split", "'test'", "['train']"]),
    ({"data.columns": {"prompt": "question", "answer": "question"}, "data.answer_extractor": "gsm8k"},
     ["data.answer_extractor 'gsm8k'", "row", "'question'"]),
    ({"data.columns": {"prompt": "question"}, "data.config": "main"}, ["data.config", "a single file has no"]),
])
def test_bad_column_split_or_extractor_names_itself(tmp_path, over, words):
    f = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(ConfigError) as e:
        load_rows(data_cfg(**{"data.dataset": str(f), **over}))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("over,words", [
    ({"data.dataset": "nowhere/d.jsonl"}, ["data.dataset", "file or folder not found", "nowhere/d.jsonl"]),
    ({"data.dataset": "./missing"}, ["data.dataset", "file or folder not found"]),
    ({"data.task": "dataset"}, ["data.dataset", "is required when data.task is 'dataset'"]),
    ({"data.task": "gsm8k", "data.dataset": "openai/gsm8k"}, ["data.dataset", "not of the 'gsm8k' task"]),
    ({"data.dataset": "a/b", "data.columns": {"prompt": "q", "gold": "g"}}, ["data.columns", "['gold']"]),
    ({"data.dataset": "a/b", "data.eval_fraction": 1.0}, ["data.eval_fraction", "[0, 1)"]),
    ({"data.dataset": "a/b", "data.prompt_template": "{question"}, ["data.prompt_template", "not a format string"]),
    ({"data.dataset": "a/b", "data.answer_extractor": "latex"}, ["data.answer_extractor", "'boxed'", "'plain'"]),
])
def test_bad_fields_fail_at_config_time(over, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, over)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_unreadable_or_unknown_files(tmp_path):
    txt = tmp_path / "d.txt"
    txt.write_text("hello")
    with pytest.raises(ConfigError, match=r"data.dataset: .*d.txt: a file must be one of \['.csv', '.json'"):
        load_rows(data_cfg(**{"data.dataset": str(txt)}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n{"prompt": oops}\n')
    with pytest.raises(ConfigError, match=r"data.dataset: cannot (read|load) .*bad.jsonl"):
        load_rows(data_cfg(**{"data.dataset": str(bad)}))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"data.dataset: cannot load .*empty"):
        load_rows(data_cfg(**{"data.dataset": str(empty)}))


def test_cli_reports_a_missing_column_as_one_paragraph(tmp_path, capsys, caplog):
    from tinyrl.cli import main

    f = write_jsonl(tmp_path / "d.jsonl", ROWS)
    args = ["train", "tiny_grpo_cpu", *[f"{k}={json.dumps(v)}" for k, v in TINY.items()],
            f"data.dataset={f}", "data.columns={prompt: query}", f"log.run_dir={tmp_path / 'runs'}"]
    assert main(args) == 2
    out = capsys.readouterr()
    text = out.err + out.out + caplog.text
    assert "data.columns.prompt" in text and "'query'" in text and "Traceback" not in text, text[-2000:]
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []  # a failed start leaves no run folder


def test_datasets_goes_offline_with_huggingface_hub(tmp_path, monkeypatch):
    """The planner turns huggingface_hub offline for a while (plans never download); `datasets` read its own
    offline flag at import, and must follow instead of retrying an unreachable hub for half a minute."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(ConfigError) as e:
        load_rows(data_cfg(**{"data.dataset": "someone/nothing"}))
    assert "OfflineModeIsEnabled" in str(e.value) and "hf download someone/nothing" in str(e.value), str(e.value)
    assert datasets.config.HF_HUB_OFFLINE is False  # restored


def test_missing_datasets_names_the_extra(tmp_path, monkeypatch):
    f = write_jsonl(tmp_path / "d.jsonl", ROWS)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed: `import datasets` raises
    with pytest.raises(ImportError, match=r"pip install 'tinyrl-rlvr\[data\]'") as e:
        load_rows(data_cfg(**{"data.dataset": str(f), "data.columns": {"prompt": "question"}}))
    assert isinstance(e.value, ConfigError)  # the CLI reports it as one paragraph, exit 2


def test_download_commands_in_messages_and_docs_exist():
    """Every download instruction users read names a command that exists today: no `huggingface-cli` (gone
    from huggingface_hub), and each `hf download` flag is one `hf download --help` lists."""
    import re
    import shutil

    texts = [p for d in ("tinyrl", "presets", "notebooks/src", "docs") for p in (REPO / d).rglob("*")
             if p.suffix in (".py", ".yaml", ".md")] + [REPO / "README.md"]
    said = {p: p.read_text(encoding="utf-8") for p in texts}
    assert [p for p, t in said.items() if "huggingface-cli" in t] == []
    commands = {m for t in said.values() for m in re.findall(r"hf download [^`\n\"']*", t)}
    assert commands  # the gsm8k task, its presets, the README say how to fetch data
    hf = shutil.which("hf", path=str(Path(sys.executable).parent)) or shutil.which("hf")
    if hf is None:
        pytest.skip("huggingface_hub's `hf` CLI is not installed")
    help_text = subprocess.run([hf, "download", "--help"], capture_output=True, text=True, timeout=60).stdout
    for cmd in commands:
        for flag in re.findall(r"--[a-z-]+", cmd):
            assert flag in help_text, (cmd, flag)
