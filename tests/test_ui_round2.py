"""The UI's second round without a server: the playground (base beside adapter, streamed, the verifier's
verdict, an agent's turns), adapters (latest / best / a checkpoint), evaluations with options and their
staleness, exports, the data section, launch safety (DOES NOT FIT), clone / archive / delete, and each
defect of issue 51 through the handlers that show it."""

import json
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from tinyrl.apps import adapters, charts, data_form, evals, exports, forms, housekeeping, procs, runs_table, runs_view
from tinyrl.config import resolve

gr = pytest.importorskip("gradio", reason="the UI needs the ui extra: pip install -e '.[ui]'")
from tinyrl.apps.form_handlers import field_value  # noqa: E402
from tinyrl.apps.handlers import N_VIEW, VIEW_FIXED, App, adapter_words  # noqa: E402

ROWS = [{"step": s, "reward_mean": r, "reward/task": r, "step_time": 1.0} for s, r in ((1, 0.2), (2, 0.9), (3, 0.3),
                                                                                       (4, 0.4))]


def _run(root, name, preset="tiny_grpo_cpu", ckpts=(2, 4), final=True, rows=ROWS, summary=None):
    """A run folder as the trainer leaves it, its adapters random LoRA weights (so the adapter answers apart)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tinyrl.model import resolve_model

    run = root / name
    run.mkdir(parents=True)
    written = resolve(preset, decide_auto=False).written
    (run / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(written["model"]["name"], None).path)
    peft = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    for where in [f"checkpoints/step-{s:06d}/adapter" for s in ckpts] + (["adapter"] if final else []):
        peft.save_pretrained(run / where)
    return run


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return root, _run(root, "r1", summary={"interrupted": False, "error": None, "eval_before": 0.4, "eval_after": 0.6})


# --------------------------------------------------------------------------- the playground


def test_playground_streams_both_sides_and_judges_a_held_out_prompt(arith):
    from tinyrl.playground import Playground

    _, run = arith
    pg = Playground.load(run, run / "checkpoints/step-000002/adapter")
    row = pg.held_out_row(0)
    steps = list(pg.chat(row["prompt"], temperature=0.0, row=row))
    assert len(steps) >= 2  # one token per step: the page gets every step
    for (b0, a0), (b1, a1) in zip(steps, steps[1:]):
        assert b1.text.startswith(b0.text) and a1.text.startswith(a0.text) and b1.tokens >= b0.tokens
    base, tuned = steps[-1]
    assert base.done and tuned.done and base.finish in ("eos", "stop", "length")
    assert base.text != tuned.text  # the adapter (random LoRA here) answers apart from the base
    assert [s.text for s in list(pg.chat(row["prompt"], row=row))[-1]] == [base.text, tuned.text]  # greedy: again
    assert pg.verdict(row, row["answer"]) is True and pg.verdict(row, row["answer"] + "0") is False
    assert len(list(pg.chat("1+1=", max_new_tokens=1))) == 1  # the budget ends both after one token


def test_playground_shows_an_agents_turns_as_the_rollout_sees_them(tmp_path):
    from tinyrl.playground import Playground

    run = _run(tmp_path, "s1", preset="tiny_search_cpu", ckpts=(), final=True)
    pg = Playground.load(run)
    row = pg.held_out_row(0)
    assert pg.render(row["prompt"]).startswith("Question:")  # the tiny model's own template
    for seed in range(40):  # sampled at T=1 the base model searches about every other question
        base, tuned = list(pg.chat(row["prompt"], temperature=1.0, seed=seed, row=row))[-1]
        if any(t["role"] == "tool" for t in base.turns):
            break
    else:
        pytest.fail("no episode called a tool in 40 seeds")
    call = next(t for t in base.turns if t.get("calls"))
    assert call["role"] == "assistant" and call["calls"][0]["name"] == "search" and "</search>" in call["text"]
    obs = base.turns[base.turns.index(call) + 1]
    assert obs["role"] == "tool" and obs["text"].startswith("<information>") and obs["text"] in base.text


# --------------------------------------------------------------------------- adapters, evaluations


def test_adapter_choices_latest_best_and_each_checkpoint(arith):
    _, run = arith
    assert adapters.choices(run) == [("latest (final adapter)", "latest"), ("best reward (checkpoint step 2)", "best"),
                                     ("final adapter, step 4", "adapter"), ("checkpoint step 4", "step-000004"),
                                     ("checkpoint step 2", "step-000002")]
    assert adapters.resolve(run, "best") == ("step-000002", run / "checkpoints/step-000002/adapter")
    with pytest.raises(FileNotFoundError, match="no checkpoint step 9 adapter"):
        adapters.resolve(run, "step-000009")


def test_eval_command_and_results_per_adapter_and_settings(arith, tmp_path):
    _, run = arith
    cmd = evals.command(run, run / "checkpoints/step-000002/adapter", 4, [1, 4], 20)
    assert cmd[3:] == ["eval", str(run / "config.yaml"), "data.num_eval=20", "--adapter",
                       str(run / "checkpoints/step-000002"), "--samples", "4", "--k", "1", "4"]
    assert evals.command(run, run / "adapter", 0, [], None)[-2:] == ["--adapter", str(run)]


def _record(run, text, key="adapter", where="adapter", samples=0, ks=()):
    rec = evals.new_record(run, key, run / where, samples, list(ks), 20)
    evals.log_path(run, rec).write_text(text)
    return rec


SAMPLED = ("held-out accuracy (greedy pass@1): 60.0%\n  prompts: 20\nsampled: 4 per prompt at temperature 1\n"
           "  pass@1:  40.0%   maj@1:  40.0%\n  pass@4:  75.0%   maj@4:  55.0%\n")


def test_a_resume_that_rewrites_the_adapter_marks_its_evaluation_stale(tmp_path):
    # defect: an evaluation result stayed shown after a resume changed the adapter
    app = App(tmp_path)
    run = _run(tmp_path, "r", ckpts=(2,))
    _record(run, SAMPLED, samples=4, ks=(1, 4))
    view, _, _ = app.run_view("r")
    v = dict(zip(VIEW_FIXED, view))
    assert v["eval"].endswith("60.0% on 20 prompts; 4 samples per prompt: pass@1 40.0% · pass@4 75.0% · maj@1 40.0% "
                              "· maj@4 55.0%") and "stale" not in v["eval"]
    assert v["evals"].value["data"][0][3:6] == ["60.0%", "pass@1 40.0% · pass@4 75.0%", "maj@1 40.0% · maj@4 55.0%"]
    assert runs_table.info(tmp_path, "r").held_out == "60.0% (eval)"  # no summary here: the evaluation's
    time.sleep(0.02)
    (run / "adapter" / "adapter_model.safetensors").write_bytes(b"resumed and saved again")  # the resume's adapter
    view, _, _ = app.run_view("r")
    v = dict(zip(VIEW_FIXED, view))
    assert v["eval"].startswith("**stale: the adapter changed after this evaluation (the run trained on)** — ~~")
    assert v["evals"].value["data"][0][-1].startswith("stale:")
    assert runs_table.info(tmp_path, "r").held_out == ""  # a stale result is not the run's held-out figure


# --------------------------------------------------------------------------- the defects, through the handlers


def test_another_runs_download_box_goes_when_a_run_without_adapter_is_chosen(tmp_path):
    app = App(tmp_path)
    _run(tmp_path, "with", ckpts=())
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.yaml").write_text("train:\n  steps: 4\n")
    assert app.download("with").visible is True
    out = app.selected("bare", {})
    file_box = out[N_VIEW + 3]
    assert file_box.visible is False and file_box.value is None
    assert dict(zip(VIEW_FIXED, out[:N_VIEW]))["download"].interactive is False


def test_a_refused_start_says_why_on_the_page_in_the_pages_words(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = App("runs")
    (tmp_path / "runs" / "taken").mkdir()
    values = [field_value(k, v) for k, v in forms.form_values("tiny_grpo_cpu", None).items()]
    msg, run, tabs, confirm, words, apply = app.form.start_form("tiny_grpo_cpu", "", *values, "taken", "",
                                                                forms.DETECTED, False)
    assert msg == "**not started:** run 'taken' exists already in runs; pick another name"
    assert str(tmp_path) not in msg and run == gr.skip() and tabs == gr.skip() and confirm.visible is False
    msg, *_ = app.form.start_form("tiny_grpo_cpu", "", *values, "", "algo.scale=groups", forms.DETECTED, False)
    assert msg.startswith("**not started:** algo.scale: expected one of")


def test_held_out_words_before_the_summary_and_for_failed_and_interrupted_runs(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  steps: 4\n")
    (run / "train.log").write_text("INFO tinyrl: held-out accuracy before training: 0.435\n")
    assert runs_table.accuracy_text(tmp_path, "r") == \
        "held-out accuracy (greedy pass@1): before 43.5%; after: none (the run failed; see the log)"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)  # killed after a checkpoint: interrupted
    assert runs_table.accuracy_text(tmp_path, "r").endswith("before 43.5%; after: none (the run stopped early; "
                                                            "Resume finishes it)")
    assert runs_table.info(tmp_path, "r").held_out == "43.5% → n/a"
    (run / "summary.json").write_text(json.dumps({"interrupted": True, "eval_before": 0.435, "eval_after": None}))
    assert runs_table.info(tmp_path, "r").held_out == "43.5% → n/a"
    assert runs_table.accuracy_text(tmp_path, "r") == ("held-out accuracy (greedy pass@1): before 43.5% → after n/a "
                                                       "(stopped before the final evaluation; Resume finishes it)")


def test_status_names_the_checkpoint_adapter_evaluate_and_download_use(tmp_path):
    run = _run(tmp_path, "r", ckpts=(2,), final=False)
    assert adapter_words(run) == "adapter: no final one yet; Evaluate, Download and Chat use checkpoint step 2's"
    view, _, _ = App(tmp_path).run_view("r")
    v = dict(zip(VIEW_FIXED, view))
    assert "adapter: no final one yet" in v["status"] and v["evaluate"].interactive and v["download"].interactive


def test_one_reward_function_is_drawn_once_and_a_flat_off_policy_panel_gets_a_range():
    reward = charts.run_chart("reward", ROWS)
    assert {p["series"] for p in reward.points} == {"reward_mean", "reward_mean (smoothed)"}
    two = [{**r, "reward/fmt": 1.0} for r in ROWS]  # two components: both drawn
    assert {"reward/task", "reward/fmt"} <= {p["series"] for p in charts.run_chart("reward", two).points}
    sync = [{"step": s, "offpolicy_ess": 1 - s * 1e-13} for s in (1, 2, 3)]  # a synchronous run's ESS
    assert charts.run_chart("off-policy", sync).y_lim == pytest.approx([0.9, 1.1])


def test_profile_entry_card_and_empty_number(tmp_path):
    app = App(tmp_path)
    assert forms.profile_choices("tiny_grpo_cpu")[0] == ("none (the preset as written)", "")
    assert app.form.profile_card("24gb", forms.DETECTED, None) == ("L4", "L4")
    assert app.form.profile_card("", "L4", "L4") == (forms.DETECTED, None)  # the profile's card goes with it
    assert app.form.profile_card("", "H100", "L4")[0] == gr.skip()  # a card the user chose stays
    values = dict(forms.form_values("tiny_grpo_cpu", None), **{"train.lr": None})
    shown, command = app.form.validate("tiny_grpo_cpu", "", *values.values(), "", "")
    assert shown == ("**tinyrl: error:** `train.lr (learning rate): the box is empty; type a number (the preset's "
                     "is 0.001)`") and command == ""
    # a profile of the previous preset, in flight while the preset changes: an error line, no exception
    shown, _ = app.form.validate("tiny_grpo_cpu", "24gb", *forms.form_values("tiny_grpo_cpu", None).values(), "", "")
    assert shown.startswith("**tinyrl: error:**") and "24gb" in shown


def test_every_request_for_a_plan_or_a_validation_waits_in_one_queue(tmp_path):
    # A plan chained after a preset change and a plan asked for by a card change were two listeners, so two
    # gradio queues: they ran side by side and the older (the detected card's) could finish last and stay on the
    # panel (a clean-clone run waited 180 s for the 4090's verdict). One queue of one: the last asked is shown last.
    from tinyrl.apps.form_handlers import FormHandlers
    from tinyrl.apps.ui import build_app

    demo = build_app(tmp_path / "runs")
    for name in ("memory", "validate"):
        fns = [b for b in demo.fns.values() if getattr(b.fn, "__func__", None) is getattr(FormHandlers, name)]
        assert len(fns) >= 5, name  # the page's load and edits, a preset, a profile, a fit applied, a dataset
        assert {b.concurrency_id for b in fns} == {name} and {b.concurrency_limit for b in fns} == {1}, name


def test_resume_says_what_changed_or_that_nothing_did(tmp_path, monkeypatch):
    app = App(tmp_path)
    run = _run(tmp_path, "r", ckpts=(4,))
    monkeypatch.setattr(app.launcher, "_spawn", lambda *a, **k: {})
    assert app.resume("r", "") == "resuming r from step-000004: nothing changed"
    assert app.resume("r", "train.steps=6") == "resuming r from step-000004: train.steps 100 → 6"
    (run / "resumes.jsonl").write_text(json.dumps({"time": "t", "overrides": {}, "changed": {}, "step": 4}) + "\n")
    view, _, _ = app.run_view("r")
    assert "resumed at t from step 4: nothing changed in the config" in dict(zip(VIEW_FIXED, view))["status"]


# --------------------------------------------------------------------------- launch safety, housekeeping


def test_a_plan_that_does_not_fit_asks_first_and_applies_what_fits(tmp_path, monkeypatch):
    app = App(tmp_path)
    started = []
    monkeypatch.setattr(app.launcher, "start", lambda plan, name=None: started.append(plan) or "big")
    values = [field_value(k, v) for k, v in forms.form_values("qwen2.5-7b_grpo_math_gpu", None).items()]
    args = ("qwen2.5-7b_grpo_math_gpu", "", *values, "", "", "A100-40")
    msg, run, tabs, confirm, words, apply = app.form.start_form(*args, False)
    assert not started and confirm.visible is True and apply.interactive is True
    assert "DOES NOT FIT" in words and "`rollout.num_generations=6`" in words
    *fields, free, note, row = app.form.apply_fit(*args)
    assert fields[forms.KEYS.index("rollout.num_generations")] == 6 and free == "" and row.visible is False
    msg, *_ = app.form.start_form(*args[:-1], "A100-40", True)  # Start anyway
    assert started and msg.startswith("started **big**")


def test_clone_fills_the_form_with_the_launch_and_a_cli_run_from_its_config(tmp_path):
    app = App(tmp_path)
    run = _run(tmp_path, "ui-run", ckpts=())
    (run / "launch.json").write_text(json.dumps({"preset": "tiny_grpo_cpu", "profile": None,
                                                 "overrides": ["train.steps=12", "algo.beta=0.04"]}))
    out = app.form.clone("ui-run")
    preset, profile, *fields = out[: 2 + len(forms.KEYS)]
    name, free, tabs, msg, action, pending = out[2 + len(forms.KEYS):]
    assert (preset, profile, name, free) == ("tiny_grpo_cpu", "", "", "algo.beta=0.04")
    assert fields[forms.KEYS.index("train.steps")] == 12 and pending["values"]["train.steps"] == 12
    assert msg.startswith("cloned **ui-run** (the settings it was launched with)") and tabs.selected == "launch"
    # the preset's events then keep the clone's values, not the preset's
    assert app.form.form_for("tiny_grpo_cpu", "", pending)[forms.KEYS.index("train.steps")] == 12
    cli = tmp_path / "cli-run"
    cli.mkdir()
    written = resolve("tiny_grpo_cpu", overrides={"train.steps": 7, "log.name": "x"}, decide_auto=False).written
    (cli / "config.yaml").write_text(yaml.safe_dump(written))
    assert housekeeping.clone(tmp_path, "cli-run")[:3] == ("tiny_grpo_cpu", None, ["train.steps=7"])


def test_archive_and_delete_ask_first_and_never_while_a_process_runs(tmp_path):
    app = App(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text("train:\n  steps: 1\n")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        procs.write_pidfile(tmp_path / "a" / "eval.pid", sleeper.pid, ["x"], "eval")
        row, words, asked = app.delete("a")
        assert asked is None and "its eval process is running" in words
        with pytest.raises(PermissionError):
            housekeeping.remove(tmp_path, "a", archive=False)
    finally:
        sleeper.kill()
        sleeper.wait()
    row, words, asked = app.archive("a")
    assert row.visible and words.startswith("Archive **a**?") and (tmp_path / "a").is_dir()  # nothing yet
    msg, row, choice = app.confirm_remove(asked)
    assert msg.startswith("archived a") and (tmp_path / ".archive" / "a" / "config.yaml").is_file()
    assert runs_view.run_names(tmp_path) == ["b"] and choice.value == "b"
    msg, _, _ = app.confirm_remove(app.delete("b")[2])
    assert msg == "deleted b (its folder is gone)" and not (tmp_path / "b").exists()


# --------------------------------------------------------------------------- exports and the data section


def test_export_commands_login_and_state(tmp_path, monkeypatch):
    run = tmp_path / "r"
    assert exports.command(run, "gguf", run / "exports/m.gguf", gguf_type="q8_0")[3:] == [
        "export", str(run), "--gguf", str(run / "exports/m.gguf"), "--gguf-type", "q8_0"]
    assert exports.command(run, "adapter", None, push="me/x", private=True)[-3:] == ["--push", "me/x", "--private"]
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    ok, words = exports.login_state()
    assert not ok and words.startswith("**not logged in** to the Hugging Face Hub") and "hf auth login" in words
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    assert exports.login_state()[0] is True
    app = App(tmp_path)
    _run(tmp_path, "e", ckpts=())
    monkeypatch.delenv("HF_TOKEN")
    assert app.tools.start_export("e", "merged", "float32", "", "me/x", False, "f16").startswith(
        "**not exported:** **not logged in**")
    assert not (tmp_path / "e" / "export.json").exists()  # nothing was started
    assert app.tools.start_export("e", "adapter", "bfloat16", "", "", False, "f16") == \
        "exported the adapter of e to e/exports/adapter"
    status, log, files, card, box = app.tools.export_view("e")
    assert status.startswith("**exported** the adapter alone (LoRA, peft) → `") and box.visible
    assert card.startswith("<details><summary>hub metadata") and "```yaml\nlibrary_name: peft" in card
    assert "A LoRA adapter (peft) for `tiny-arith`" in card
    assert sorted(r[0] for r in files.value["data"]) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    sizes = dict(files.value["data"])  # in the unit that reads: a small config is no "0.00 MiB"
    assert sizes["adapter_config.json"].endswith((" B", " KiB")) and not sizes["README.md"].startswith("0.00")
    assert app.tools.start_export("e", "merged", "float32", "../x", "", False, "f16").startswith(
        "**not exported:** export name '../x': not a run name")


def test_a_dataset_file_is_kept_mapped_and_previewed(tmp_path):
    app = App(tmp_path / "runs")
    src = tmp_path / "my sums.jsonl"
    src.write_text("".join(json.dumps({"question": f"{a}+{a}=", "solution": str(2 * a)}) + "\n" for a in range(10, 60)))
    choice, note = app.form.upload(str(src))
    kept = tmp_path / "runs" / "data" / "my-sums.jsonl"
    assert choice.value == str(kept) and kept.is_file() and note == f"uploaded: `{kept}`"
    prompt_col, answer_col, words = app.form.columns(str(kept), "", "")
    assert prompt_col.choices == [("question", "question"), ("solution", "solution")] and prompt_col.value == "question"
    assert answer_col.value == forms.AUTO_ANSWER and ("solution", "solution") in answer_col.choices
    values = dict(forms.form_values("tiny_grpo_cpu", None), **{"data.dataset": str(kept),
                                                               "data.columns.prompt": "question",
                                                               "data.columns.answer": "solution"})
    plan = forms.validate("tiny_grpo_cpu", None, values, "")
    assert plan.overrides == [f"data.dataset={kept}", "data.columns.prompt=question", "data.columns.answer=solution"]
    text = app.form.preview("tiny_grpo_cpu", "", *values.values(), "", "", "")
    assert "task `dataset`" in text and "sample answer `\\boxed{" in text and "→ reward **1.0**" in text
    wrong = app.form.preview("tiny_grpo_cpu", "", *values.values(), "", "", "\\boxed{0}")
    assert "sample answer `\\boxed{0}` → reward **0.0** (the task's verifier rejects it)" in wrong
    assert data_form.answers({"golden_answers": ["Mostoton"]})[-1] == "<answer> Mostoton </answer>"


def test_the_adapter_picked_for_evaluate_stays_and_a_run_that_gains_one_gets_latest(tmp_path):
    app = App(tmp_path)
    run = _run(tmp_path, "r", ckpts=(2,), final=False)
    pick = lambda out: dict(zip(VIEW_FIXED, out[3: 3 + N_VIEW]))["eval_ckpt"]  # noqa: E731
    assert pick(app.tick("r", [], {}, "step-000002")).value == "step-000002"
    shutil.rmtree(run / "checkpoints")  # a run still training (no adapter yet) ...
    assert pick(app.tick("r", [], {}, None)).value is None
    _run(tmp_path, "r2", ckpts=(), final=True)  # ... and one whose adapter arrived: latest, not left blank
    assert pick(app.tick("r2", [], {}, None)).value == "latest"
