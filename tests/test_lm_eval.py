"""`tinyrl eval RUN --lm-eval TASKS` (tinyrl/lm_eval_bridge.py): lm-evaluation-harness over a trained run, offline.

The harness task is defined here on local files (a task YAML with `dataset_path: json` and `data_files`): the held-out
prompts of the run's own arithmetic task, scored by the harness's `exact_match` on greedy `generate_until` output.
tinyrl's own evaluation (`tinyrl.evaluate`, the same greedy decoding through tinyrl's engine) must agree with it,
row by row and in accuracy. The run's adapter is moved well away from zero first, so that base and adapter answer
differently: an evaluation that dropped the adapter would fail the comparison.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import tinyrl
from tinyrl import lm_eval_bridge
from tinyrl.cli import main
from tinyrl.errors import ConfigError, MissingExtra

pytest.importorskip("lm_eval")
TASK = "tinyrl_sums_heldout"
N_EVAL = 24


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests.test_export import push_adapter_away_from_zero

    root = tmp_path_factory.mktemp("runs")
    path = tinyrl.train("tiny_grpo_cpu", **{
        "log.run_dir": str(root), "log.progress": False, "train.steps": 2, "train.prompts_per_step": 4,
        "rollout.num_generations": 4, "train.micro_batch_size": 16, "data.num_train": 64, "data.num_eval": N_EVAL,
        "train.eval_before_after": False}).path
    push_adapter_away_from_zero(path / "adapter", scale=0.02)
    return path


@pytest.fixture(scope="module")
def task_dir(run, tmp_path_factory):
    """The run's held-out prompts as a jsonl file, and a harness task on it (few-shot examples from a train file)."""
    from tinyrl.config import resolve
    from tinyrl.data import load_rows

    cfg = resolve(resume=str(run), decide_auto=False).cfg
    train, held, _ = load_rows(replace(cfg.data, num_eval=N_EVAL))
    d = tmp_path_factory.mktemp("lm_tasks")
    (d / "held.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in held))
    (d / "shots.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n"
                                           for r in train[:8]))
    (d / f"{TASK}.yaml").write_text(f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d / 'held.jsonl'}
    train: {d / 'shots.jsonl'}
test_split: test
fewshot_split: train
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
fewshot_delimiter: "\\n"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""")
    return d


def tinyrl_greedy(run) -> dict[str, tuple[str, bool]]:
    """prompt -> (the completion `tinyrl eval` decodes, whether the task's verifier accepts it): build_run and its
    engine, as tinyrl.api.evaluate does (tinyrl.evaluation.evaluate_rows)."""
    from tinyrl import distributed
    from tinyrl.config import resolve
    from tinyrl.methods.common import build_run

    cfg = resolve("tiny_grpo_cpu", overrides={"data.num_eval": N_EVAL}, decide_auto=False).cfg
    parts = build_run(cfg, distributed.setup(), adapter=str(run), train=False, engine="hf")
    rows = parts.eval_rows
    out = parts.engine.generate([r["rendered"] for r in rows], n=1, params=replace(parts.sampling, temperature=1.0),
                                columns=rows, greedy=True)
    return {r["prompt"]: (c, bool(parts.task.is_correct(c, r))) for r, c in zip(rows, out.completions)}


def test_lm_eval_agrees_with_tinyrl_eval_row_by_row(run, task_dir):
    got = tinyrl.evaluate(adapter=run, lm_eval=TASK, lm_eval_include=task_dir)
    acc = got.results[TASK]["exact_match,none"]
    samples = [json.loads(line) for line in got.samples_path.read_text().splitlines()]
    assert len(samples) == N_EVAL and got.n_shot[TASK] == 0
    ours = tinyrl_greedy(run)
    theirs = {s["doc"]["prompt"]: s["filtered_resps"][0] for s in samples}
    assert set(ours) == set(theirs)
    # the harness cuts its response at the stop string; tinyrl keeps the one trailing "\n" its verifier allows
    assert {p: c.split("\n")[0] for p, (c, _) in ours.items()} == theirs
    assert {p: ok for p, (_, ok) in ours.items()} == {s["doc"]["prompt"]: s["exact_match"] == 1.0 for s in samples}
    assert acc == tinyrl.evaluate("tiny_grpo_cpu", adapter=run, **{"data.num_eval": N_EVAL})
    assert 0 < acc < 1  # some right, some wrong: the comparison can fail both ways
    # written beside tinyrl's own evaluations, in summary.json, and so on the model card
    whole = json.loads(got.path.read_text())
    assert got.path.parent == run and whole["results"][TASK]["exact_match,none"] == acc
    assert whole["settings"]["tasks"] == [TASK] and whole["n-shot"][TASK] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["details"]["lm_eval"][TASK]["exact_match,none"] == acc and summary["method"] == "grpo"
    from tinyrl.hub_push import model_card

    assert f"lm-evaluation-harness `{TASK}`" in model_card(run)


def test_cli_lm_eval_with_shots_and_a_limit(run, task_dir, capsys):
    rc = main(["eval", str(run), "--lm-eval", TASK, "--lm-eval-include", str(task_dir), "--lm-eval-fewshot", "2",
               "--lm-eval-limit", "5", "--lm-eval-batch-size", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{TASK} (2-shot, 5 documents)" in out and "exact_match,none:" in out
    newest = sorted(run.glob("lm_eval-*-samples.jsonl"))[-1]
    samples = [json.loads(line) for line in newest.read_text().splitlines()]
    assert len(samples) == 5
    prompt = samples[0]["arguments"][0][0]  # (context, generation kwargs) of its one request
    assert prompt.count("=") == 3 and prompt.endswith(samples[0]["doc"]["prompt"])  # two shots, then the question


def test_unknown_task_names_the_harness_list_and_a_close_name(run):
    with pytest.raises(ConfigError, match=r"no task, group or tag 'gsm9k' \(did you mean gsm8k.*lm-eval ls tasks"):
        tinyrl.evaluate(adapter=run, lm_eval="arc_easy,gsm9k")


@pytest.mark.parametrize("kwargs, match", [
    ({"lm_eval": ""}, "name at least one harness task"),
    ({"lm_eval": " , ,"}, "name at least one harness task"),
    ({"lm_eval": [1, 2]}, "task names, comma-separated"),
    ({"lm_eval": 7}, "task names, comma-separated"),
    ({"lm_eval": "../../etc/passwd"}, "is not a task name"),
    ({"lm_eval": "gsm8k\x00rm"}, "is not a task name"),
    ({"lm_eval": "a" * 500}, "is not a task name"),
    ({"lm_eval": ",".join(f"t{i}" for i in range(100))}, "at most 64 tasks"),
    ({"lm_eval": TASK, "lm_eval_limit": 0}, r"--lm-eval-limit: must be in \[1, 1000000\], got 0"),
    ({"lm_eval": TASK, "lm_eval_limit": -3}, r"--lm-eval-limit: must be in"),
    ({"lm_eval": TASK, "lm_eval_limit": 10**12}, r"--lm-eval-limit: must be in"),
    ({"lm_eval": TASK, "lm_eval_limit": "5"}, "--lm-eval-limit: a whole number"),
    ({"lm_eval": TASK, "lm_eval_limit": 0.5}, "--lm-eval-limit: a whole number"),
    ({"lm_eval": TASK, "lm_eval_limit": True}, "--lm-eval-limit: a whole number"),
    ({"lm_eval": TASK, "lm_eval_fewshot": -1}, r"--lm-eval-fewshot: must be in \[0, 100\]"),
    ({"lm_eval": TASK, "lm_eval_fewshot": 10**9}, r"--lm-eval-fewshot: must be in"),
    ({"lm_eval": TASK, "lm_eval_batch_size": 0}, r"--lm-eval-batch-size: must be in \[1, 1024\]"),
    ({"lm_eval": TASK, "lm_eval_batch_size": 10**6}, r"--lm-eval-batch-size: must be in"),
    ({"lm_eval": TASK, "lm_eval_include": "/no/such/folder"}, "--lm-eval-include: /no/such/folder: not a folder"),
    ({"lm_eval": TASK, "lm_eval_include": ""}, "--lm-eval-include: a folder of harness task YAMLs"),
    ({"lm_eval_limit": 5}, "go with lm_eval=TASKS"),
    ({"lm_eval": TASK, "samples": 4}, "harness alone"),
    ({"lm_eval": TASK, "data.num_eval": 4}, "harness alone"),
])
def test_bad_lm_eval_arguments_fail_before_anything_loads(run, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        tinyrl.evaluate(adapter=run, **kwargs)


def test_lm_eval_needs_a_run_with_an_adapter(run, tmp_path):
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.yaml").write_text((run / "config.yaml").read_text())
    with pytest.raises(ConfigError, match="the run has no final adapter"):
        tinyrl.evaluate(adapter=tmp_path / "unfinished", lm_eval="arc_easy")
    with pytest.raises(ConfigError, match="no such run folder"):
        tinyrl.evaluate(adapter=tmp_path / "nothing", lm_eval="arc_easy")
    with pytest.raises(ConfigError, match="give adapter=RUN_DIR"):
        tinyrl.evaluate(lm_eval="arc_easy")
    assert main(["eval", str(tmp_path / "unfinished"), "--lm-eval", "arc_easy"]) == 2
    assert main(["eval", "tiny_grpo_cpu", str(run), "--lm-eval", "arc_easy"]) == 2  # a preset and a run: which?
    assert main(["eval", str(run), "--lm-eval", "arc_easy", "--samples", "4"]) == 2
    assert main(["eval", str(run), "--lm-eval-limit", "4"]) == 2
    with pytest.raises(SystemExit):
        main(["eval", str(run), "--lm-eval", "arc_easy", "--lm-eval-limit", "many"])  # argparse: not a number


def test_without_lm_eval_installed_the_error_names_the_extra(run, monkeypatch):
    real = lm_eval_bridge.importlib.import_module

    def no_lm_eval(name, *a, **kw):
        if name == "lm_eval":
            raise ImportError("No module named 'lm_eval'")
        return real(name, *a, **kw)

    monkeypatch.setattr(lm_eval_bridge.importlib, "import_module", no_lm_eval)
    with pytest.raises(MissingExtra, match=r"pip install 'tinyrl-rlvr\[lm-eval\]'"):
        tinyrl.evaluate(adapter=run, lm_eval="arc_easy")
    assert isinstance(MissingExtra("x"), ImportError) and Path(run).is_dir()


def test_scores_reach_the_runs_trackers_at_its_last_step(run, monkeypatch):
    """The run's trackers (log.report_to) get the scores as lm_eval/<task>/<metric> at the run's last step."""
    import tinyrl.trackers.fanout as fanout
    from tinyrl.config import resolve

    sent = []

    class Recorder:
        def benchmark_results(self, results, step, prefix="lm_eval"):
            sent.append((results, step))

        def close(self):
            sent.append("closed")

    monkeypatch.setattr(fanout, "open_trackers", lambda cfg, path, is_main, step: Recorder())
    cfg = resolve(resume=str(run), overrides={"log.report_to": ["tensorboard"]}, decide_auto=False).cfg
    scores = {TASK: {"exact_match,none": 0.5}}
    lm_eval_bridge._to_trackers(cfg, run, scores)
    assert sent == [(scores, 2), "closed"]  # summary.json's steps: 2
    sent.clear()
    lm_eval_bridge._to_trackers(resolve(resume=str(run), decide_auto=False).cfg, run, scores)
    assert sent == []  # no tracker named: none opened
