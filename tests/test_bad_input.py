"""The bad-input table: every way a user can hand tinyrl something wrong, and what the CLI must say.

Each row builds its bad input in a fresh temp directory and runs `tinyrl` on it. A row that
must fail expects a non-zero exit and the words that name the problem (the field, the file,
the line); a row that must succeed with a warning expects exit 0 and the warning. Never a
traceback, never a silent success, and a failed start leaves no run folder behind.

The table runs twice: in-process through `tinyrl.cli.main` (fast, in the default suite) and
as real `python -m tinyrl.cli` subprocesses (slow), where stderr must hold no "Traceback".
A few rows (a full disk, a read-only disk) exist only as subprocesses, where the limit can
be set on the child alone.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from tinyrl.runs import LOCK_FILE, RunDir, read_jsonl

REPO = Path(__file__).resolve().parents[1]
ME = "tests.test_bad_input"
TINY = ["model.name=tiny-arith", "train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=2",
        "train.micro_batch_size=4", "train.eval_before_after=false", "log.progress=false",
        "data.num_train=16", "data.num_eval=4", "rollout.max_new_tokens=6"]

# --- rewards the table points presets at --------------------------------------------------------

NOT_CALLABLE = 3


def no_completions(prompts, answers):
    return [0.0] * len(prompts)


def named_only(prompts, completions):
    return [0.0] * len(completions)


def exits(prompts, completions, **kw):
    raise SystemExit(0)  # used to end the whole run with exit status 0


def infinite(prompts, completions, **kw):
    return [float("inf")] * len(completions)


def huge(prompts, completions, **kw):
    return [(1e38, 2e38)[k % 2] for k in range(len(completions))]  # finite, but their float32 squares are not


TEST_PID = os.getpid()


def hard_exit(prompts, completions, **kw):
    if os.getpid() == TEST_PID:  # called in this test process (the code before the fix): fail, do not end pytest
        raise RuntimeError("the reward ran in the trainer's own process")
    os._exit(3)


def segfault(prompts, completions, **kw):
    if os.getpid() == TEST_PID:
        raise RuntimeError("the reward ran in the trainer's own process")
    import ctypes

    ctypes.string_at(0)


# --- the table ---------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    build: Callable  # (tmp: Path, fixtures: dict) -> argv after "tinyrl"
    rc: int  # expected exit status
    says: list[str]  # each must appear in stderr + log output
    fresh: bool = True  # a failed start: no run folder may be left under tmp/runs
    check: Callable | None = None  # (tmp) -> None: more assertions on what was written
    subprocess_only: str = ""  # why it cannot run in-process
    limit_fsize: int | None = None  # RLIMIT_FSIZE of the child (a full disk)
    never: list[str] = field(default_factory=list)  # words that must not appear (logs captured from DEBUG up)


def runs(tmp):
    return f"log.run_dir={tmp / 'runs'}"


def write(tmp, name, data, mode="w"):
    p = tmp / name
    with open(p, mode) as f:
        f.write(data)
    return p


def preset(text, mode="w", name="p.yaml"):
    return lambda tmp, fx: ["train", str(write(tmp, name, text, mode)), runs(tmp)]


def train(*args):
    return lambda tmp, fx: ["train", *TINY, runs(tmp), *args]


def model_folder(mutate):
    def build(tmp, fx):
        d = tmp / "model"
        shutil.copytree(REPO / "tinyrl" / "assets" / "tiny-arith", d)
        mutate(d)
        return ["train", *TINY, runs(tmp), f"model.name={d}"]
    return build


def truncate(path, keep=0.5):
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * keep)])


def nan_weights(d):
    from safetensors.torch import load_file, save_file

    w = load_file(str(d / "model.safetensors"))
    name = sorted(w)[0]
    w[name][0] = float("nan")
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})


def no_tokenizer(d):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()


def jsonl(text):
    return lambda tmp, fx: ["train", *TINY, runs(tmp), "data.task=jsonl", f"data.path={write(tmp, 'd.jsonl', text)}",
                            "reward.functions=[tests.test_bad_input:named_only]"]


def run_folder(mutate=None):
    """A copy of a finished run folder, changed by `mutate(folder)`; its path."""
    def make(tmp, fx):
        dst = tmp / "runs" / "old"
        shutil.copytree(fx["finished"], dst)
        (dst / LOCK_FILE).unlink(missing_ok=True)
        if mutate:
            mutate(dst)
        return dst
    return make


def resume(mutate=None, *extra):
    return lambda tmp, fx: ["train", *extra, "--resume", str(run_folder(mutate)(tmp, fx))]


def corrupt_all_checkpoints(folder):
    for ckpt in RunDir(folder).checkpoints():
        truncate(ckpt / "trainer_state.pt", 0.1)


def locked(tmp, fx):
    folder = run_folder()(tmp, fx)
    holder = RunDir(folder)
    holder.lock()  # this test process is the live writer
    fx["holders"].append(holder)
    return ["train", "--resume", str(folder)]


def adapter(mutate):
    def build(tmp, fx):
        folder = run_folder(mutate)(tmp, fx)
        return ["eval", "--adapter", str(folder), "model.name=tiny-arith", "data.num_eval=4"]
    return build


def strict_jsonl(tmp):
    def strict(name):
        raise ValueError(f"{name} is not JSON")

    (folder,) = (tmp / "runs").iterdir()
    for name in ("metrics.jsonl", "samples.jsonl"):
        for line in (folder / name).read_text().splitlines():
            json.loads(line, parse_constant=strict)
    metrics = read_jsonl(folder / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["reward_failures"] == 4 for m in metrics)


def nothing_escaped(tmp):
    assert not (tmp / "escaped").exists()


def previous_checkpoint_intact(tmp):
    (folder,) = (tmp / "runs").iterdir()
    assert all(p.name.startswith("step-") for p in (folder / "checkpoints").iterdir())


def metrics_of(tmp) -> list[dict]:
    (folder,) = (tmp / "runs").iterdir()
    return read_jsonl(folder / "metrics.jsonl")


def huge_rewards_train(tmp):
    """Rewards of 1e38 / 2e38: finite statistics (computed in float64), advantages that are not all 0."""
    for m in metrics_of(tmp):
        assert m["reward_mean"] is not None and 1e38 <= m["reward_mean"] <= 2e38, m
        assert m["reward_std"] is not None and m["reward_excluded_frac"] == 0.0, m
        assert not m["skipped_no_signal"] and m["grad_norm"] > 1e-4, m


def nothing_usable_is_a_metric(tmp):
    assert [m["reward_excluded_frac"] for m in metrics_of(tmp)] == [1.0, 1.0]


def failures_counted_by_name(name):
    def check(tmp):
        assert [m[f"reward_failures/{name}"] for m in metrics_of(tmp)] == [4, 4]
    return check


def nothing_beside_run_dir(tmp):
    assert [p.name for p in tmp.iterdir() if p.name != "runs"] == []  # not runs-<time>, a folder beside log.run_dir


def gaia(tmp, corpus: bool):
    meta = write(tmp, "metadata.jsonl", json.dumps({"task_id": "a", "Question": "Who is Evan Morris?",
                                                   "Final answer": "a lobbyist", "Level": 1, "file_name": ""}) + "\n")
    corpus_arg = [f"agent.corpus={REPO / 'tinyrl' / 'assets' / 'search-world' / 'corpus.jsonl'}"] if corpus else []
    return ["eval", "tiny_search_cpu", "--gaia", str(meta), "data.num_eval=1", *corpus_arg]


def name_taken(tmp, fx):
    (tmp / "runs").mkdir()
    write(tmp / "runs", "taken", "a file where the run folder would go")
    return ["train", *TINY, runs(tmp), "log.name=taken"]


def read_only_cmd(tmp, argv):
    """argv wrapped so the child sees tmp/runs read-only: chmod when not root (root ignores modes),
    a read-only bind mount in a private mount namespace when root."""
    (tmp / "runs").mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "tinyrl.cli", *argv]
    if os.geteuid() != 0:
        (tmp / "runs").chmod(0o555)
        return cmd
    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("root without mount namespaces: no way to make a read-only folder here")
    ro = str(tmp / "runs")
    return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"',
            ro, *cmd]


CASES = [
    # presets
    Case("preset_malformed_yaml", preset("train: [\n"), 2, ["p.yaml, line 2", "not valid YAML"]),
    Case("preset_list", preset("- a\n- b\n"), 2, ["must be a mapping of sections", "list"]),
    Case("preset_scalar", preset("42\n"), 2, ["must be a mapping of sections", "int"]),
    Case("preset_binary", preset(bytes(range(256)) * 4, "wb"), 2, ["not a text file"]),
    Case("preset_empty", preset(""), 2, ["p.yaml is empty", "sets nothing"]),
    Case("preset_only_comments", preset("# nothing here\n"), 2, ["is empty"]),
    Case("preset_wrong_suffix", preset("train: {steps: 1}\n", name="p.txt"), 2, ["must end in .yaml"]),
    Case("preset_duplicate_keys_warn", lambda tmp, fx: ["train", str(write(tmp, "dup.yaml", (
        "model: {name: tiny-arith}\ntrain: {steps: 9}\ntrain: {steps: 0, eval_before_after: false}\n"
        "log: {progress: false}\nrollout: {max_new_tokens: 8}\n"))), runs(tmp)], 0,
         ["dup.yaml, line 3: key 'train' is given twice"], fresh=False),
    # overrides and values that used to train silently wrong
    Case("override_not_yaml", train("train.lr=[1"), 2, ["override 'train.lr=[1'", "not valid YAML"]),
    Case("override_unknown_field", train("train.stepz=3"), 2, ["train.stepz: unknown field (did you mean 'steps'?)"]),
    Case("override_no_equals", lambda tmp, fx: ["train", "p.yaml", "train.steps"], 2,
         ["unexpected argument 'train.steps'; overrides look like section.field=value"]),
    Case("override_no_equals_and_no_preset", lambda tmp, fx: ["train", *TINY, runs(tmp), "train.steps"], 2,
         ["unexpected argument 'train.steps'; overrides look like section.field=value"]),
    Case("std_eps_negative", train("algo.std_eps=-0.1"), 2, ["algo.std_eps: must be > 0"]),
    Case("std_eps_zero", train("algo.std_eps=0"), 2, ["algo.std_eps: must be > 0"]),
    Case("lr_nan", train("train.lr=.nan"), 2, ["train.lr: must be > 0 and finite, got nan"]),
    Case("lr_inf", train("train.lr=.inf"), 2, ["train.lr: must be > 0 and finite, got inf"]),
    Case("reward_weight_nan", train("reward.functions=[{name: task, weight: .nan}]"), 2,
         ["reward.functions[0].weight: must be a finite number"]),
    Case("warmup_negative", train("train.warmup_steps=-1"), 2, ["train.warmup_steps: must be >= 0"]),
    Case("samples_per_step_negative", train("log.samples_per_step=-2"), 2, ["log.samples_per_step: must be >= 0"]),
    Case("reward_timeout_zero", train("reward.timeout=0"), 2, ["reward.timeout: must be > 0 seconds"]),
    Case("num_eval_more_than_the_task_has", train("data.num_eval=5000"), 2, ["data (task 'arithmetic')", "num_eval=5000"]),
    Case("task_args_unknown", train("data.task_args={digits: 2, nope: 1}"), 2, ["data.task_args", "nope"]),
    # what cannot work is refused at start (tinyrl.planner.preflight), before any run folder exists
    Case("completion_beyond_the_model_context", train("rollout.max_new_tokens=100000"), 2,
         ["rollout.max_new_tokens: 100000 new tokens", "beyond the context of model 'tiny-arith'",
          "max_position_embeddings 64", "the largest that fits is"]),
    # (B x G at the largest the config takes; at G=2 the plan is 7.8 GiB, but such a run was seen to use > 22 GiB)
    Case("planned_peak_above_the_device_memory", train("train.prompts_per_step=65536", "rollout.num_generations=16"), 2,
         ["the run does not fit: its planned peak", "Lower train.prompts_per_step (now 65536, the largest that fits:",
          "train.ignore_memory_plan=true"]),
    Case("planned_peak_above_the_device_memory_ignored",
         train("train.prompts_per_step=65536", "rollout.num_generations=16", "train.ignore_memory_plan=true",
               "train.steps=0"), 0,
         ["the run may not fit", "starting anyway (train.ignore_memory_plan)"], fresh=False),
    Case("plan_gpu_mem_zero", lambda tmp, fx: ["plan", "tiny_grpo_cpu", "--gpu-mem", "0"], 2,
         ["--gpu-mem '0': must be a size above 0"]),
    # rewards
    Case("reward_unknown", train("reward.functions=[nope]"), 2, ["unknown reward 'nope'"]),
    Case("reward_not_importable", train("reward.functions=[no.such.module:f]"), 2, ["cannot import 'no.such.module:f'"]),
    Case("reward_not_callable", train(f"reward.functions=[{ME}:NOT_CALLABLE]"), 2, ["is a int, not a function"]),
    Case("reward_wrong_signature", train(f"reward.functions=[{ME}:no_completions]"), 2, ["must take `completions`"]),
    Case("reward_kwargs_not_accepted", train(f"reward.functions=[{{name: '{ME}:named_only', kwargs: {{scale: 2}}}}]"),
         2, ["does not take the kwargs ['scale']"]),
    Case("reward_system_exit_is_counted", train(f"reward.functions=[{ME}:exits]"), 0,
         ["failed on the whole batch (SystemExit", "run folder:"], fresh=False),
    Case("reward_inf_is_counted_not_written", train(f"reward.functions=[{ME}:infinite]"), 0,
         ["4 of 4 samples scored no finite number"], fresh=False, check=strict_jsonl),
    Case("reward_none_usable_is_said", train(f"reward.functions=[{ME}:infinite]"), 0,
         ["no sample of this batch has a usable reward (all 4 excluded; failed: infinite: 4)"], fresh=False,
         check=nothing_usable_is_a_metric),
    Case("reward_huge_finite_values_train", train(f"reward.functions=[{ME}:huge]", "algo.scale=batch"), 0, [],
         fresh=False, check=huge_rewards_train),
    Case("reward_os_exit_is_counted", train(f"reward.functions=[{ME}:hard_exit]"), 0,
         ["reward 'hard_exit' failed on the whole batch", "exited with status 3", "run folder:"], fresh=False,
         check=failures_counted_by_name("hard_exit")),
    Case("reward_segfault_is_counted", train(f"reward.functions=[{ME}:segfault]"), 0,
         ["reward 'segfault' failed on the whole batch", "killed by SIGSEGV", "run folder:"], fresh=False,
         check=failures_counted_by_name("segfault")),
    # models
    Case("model_missing", train("model.name=/no/such/model"), 2, ["model.name: '/no/such/model' is not a built-in"]),
    Case("model_truncated_safetensors", model_folder(lambda d: truncate(d / "model.safetensors")), 2,
         ["model.safetensors is truncated or corrupt"]),
    Case("model_missing_tokenizer", model_folder(no_tokenizer), 2, ["could not load the tokenizer", "tokenizer.json"]),
    Case("model_bad_config_json", model_folder(lambda d: (d / "config.json").write_text("{not json")), 2,
         ["config.json", "not a valid JSON"]),
    Case("model_config_does_not_fit", model_folder(lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"hidden_size": 128', '"hidden_size": 96'))), 2,
         ["config.json does not fit the weights"]),
    Case("model_nan_weights", model_folder(nan_weights), 2, ["has NaN or inf weights in 1 tensors"]),
    Case("lora_unknown_target", train("lora.target_modules=[q_proj, nope]"), 2,
         ["lora.target_modules: ['nope'] are not modules of this model", "q_proj"]),
    # data
    Case("jsonl_not_json", jsonl('{"prompt": "1+1="}\n{"prompt": oops}\n'), 2, ["d.jsonl, line 2: not valid JSON"]),
    Case("jsonl_not_an_object", jsonl('["1+1="]\n'), 2, ["d.jsonl, line 1: expected a JSON object"]),
    Case("jsonl_no_prompt_column", jsonl('{"question": "1+1="}\n'), 2, ["d.jsonl, line 1: no 'prompt' column"]),
    Case("jsonl_empty_prompt", jsonl('{"prompt": ""}\n'), 2, ["line 1: 'prompt' must be a non-empty string"]),
    Case("jsonl_empty_file", jsonl(""), 2, ["d.jsonl: no rows"]),
    Case("jsonl_missing_file", lambda tmp, fx: ["train", *TINY, runs(tmp), "data.task=jsonl",
                                                f"data.path={tmp / 'none.jsonl'}"], 2, ["data.path: file not found"]),
    Case("jsonl_path_is_a_folder", lambda tmp, fx: ["train", *TINY, runs(tmp), "data.task=jsonl", f"data.path={tmp}"],
         2, ["data.path:", "is a folder; give the .jsonl file in it"]),
    # agents
    Case("gaia_without_a_corpus", lambda tmp, fx: gaia(tmp, corpus=False), 2,
         ["agent.corpus: the search tool needs a corpus", "set agent.corpus=PATH"]),
    Case("gaia_with_a_corpus_keeps_bm25s_quiet", lambda tmp, fx: gaia(tmp, corpus=True), 0,
         ["held-out accuracy (greedy pass@1)"], never=["bm25s"]),
    # adapters
    Case("adapter_missing", lambda tmp, fx: ["eval", "--adapter", str(tmp / "nowhere")], 2,
         ["--adapter", "nowhere: missing (no such file or folder)"]),
    Case("adapter_not_an_adapter_folder", lambda tmp, fx: ["eval", "--adapter", str(tmp)], 2,
         ["not an adapter folder", "adapter_config.json"]),
    Case("adapter_of_an_interrupted_run", adapter(lambda f: shutil.rmtree(f / "adapter")), 2,
         ["no final adapter", "checkpoints/step-000002/adapter"], fresh=False),
    Case("adapter_corrupt", adapter(lambda f: truncate(f / "adapter" / "adapter_model.safetensors")), 2,
         ["the adapter is corrupt"], fresh=False),
    Case("adapter_config_corrupt", adapter(lambda f: (f / "adapter" / "adapter_config.json").write_text("{")), 2,
         ["adapter_config.json is corrupt"], fresh=False),
    # run folders and checkpoints
    Case("resume_missing_folder", lambda tmp, fx: ["train", "--resume", str(tmp / "runs" / "none")], 2,
         ["no such run folder"]),
    Case("resume_corrupt_config", resume(lambda f: (f / "config.yaml").write_text("train: [\n")), 2,
         ["old/config.yaml, line", "config is corrupt"], fresh=False),
    Case("resume_config_not_a_mapping", resume(lambda f: (f / "config.yaml").write_text("- 1\n")), 2,
         ["config.yaml: the run folder's config is corrupt"], fresh=False),
    Case("resume_invalid_override", resume(None, "train.lr=-1"), 2, ["config.yaml with the overrides", "train.lr"],
         fresh=False),
    Case("resume_all_checkpoints_corrupt_and_a_preset", resume(corrupt_all_checkpoints, "tiny_grpo_cpu"), 2,
         ["the preset 'tiny_grpo_cpu' ignored", "no checkpoint loads", "step-000002:", "trainer_state.pt is truncated"],
         fresh=False),
    Case("resume_no_checkpoint", resume(lambda f: shutil.rmtree(f / "checkpoints")), 2, ["no checkpoint in"],
         fresh=False),
    Case("resume_folder_in_use", locked, 2, [f"is in use by pid {os.getpid()}"], fresh=False),
    Case("run_dir_is_a_file", lambda tmp, fx: ["train", *TINY, f"log.run_dir={write(tmp, 'afile', 'x')}"], 2,
         ["afile", "File exists"]),
    Case("run_name_is_a_file", name_taken, 2, ["runs/taken exists and is not a folder"], fresh=False),
    Case("run_name_escapes", train("log.name=../escaped"), 2, ["log.name: must be a folder name inside log.run_dir"],
         check=nothing_escaped),
    Case("run_name_is_the_run_dir", train("log.name=."), 2,
         ["log.name: must be a folder name inside log.run_dir", "got '.'"], check=nothing_beside_run_dir),
    # disks (a child process of its own: the limit is on it alone)
    Case("disk_full_at_checkpoint", train("train.save_every=1"), 2,
         ["cannot write the checkpoint", "File too large", "the previous checkpoint is intact"], fresh=False,
         check=previous_checkpoint_intact, subprocess_only="RLIMIT_FSIZE on the child", limit_fsize=96 << 10),
    Case("disk_read_only", train(), 2, ["runs", "Read-only file system" if os.geteuid() == 0 else "Permission denied"],
         subprocess_only="a read-only mount of the child's own"),
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-step run folder of the shipped tiny model (checkpointed each step)."""
    from tinyrl.api import train as api_train
    from tinyrl.config import parse_override

    overrides = {".".join(k): v for k, v in map(parse_override, TINY)}
    overrides.update({"train.save_every": 1, "train.keep_last": 3, "log.run_dir": str(tmp_path_factory.mktemp("runs")),
                      "log.name": "done"})
    return api_train(**overrides).path


@pytest.fixture
def fx(finished):
    holders = []
    yield {"finished": finished, "holders": holders}
    for h in holders:
        h.unlock()


def after(case, tmp, rc, text):
    assert rc == case.rc, f"{case.id}: exit {rc}, expected {case.rc}\n{text[-3000:]}"
    for words in case.says:
        assert words in text, f"{case.id}: {words!r} not said\n{text[-3000:]}"
    for words in case.never:
        assert words not in text, f"{case.id}: {words!r} said\n{text[-3000:]}"
    if case.fresh and case.rc != 0:
        left = list((tmp / "runs").iterdir()) if (tmp / "runs").is_dir() else []
        assert left == [], f"{case.id}: a failed start left {left}"
    if case.check:
        case.check(tmp)


@pytest.mark.parametrize("case", [c for c in CASES if not c.subprocess_only], ids=lambda c: c.id)
def test_bad_input_in_process(case, tmp_path, fx, capsys, caplog):
    from tinyrl.cli import main

    argv = case.build(tmp_path, fx)
    with caplog.at_level(logging.DEBUG if case.never else logging.INFO):
        rc = main(argv)  # an exception escaping here is the traceback the CLI must never show
    out = capsys.readouterr()
    assert "Traceback" not in out.err + caplog.text, f"{case.id}:\n{(out.err + caplog.text)[-3000:]}"
    after(case, tmp_path, rc, out.err + out.out + caplog.text)


def representatives(cases) -> list:
    """The cases run again as a subprocess: those only a child process can show (subprocess_only), and the first of
    each family (the id's first word: model_, reward_, resume_, ...), so each kind of failure is seen once through the
    real CLI: its exit code, its stderr with no traceback. Every case runs in-process too, with the same checks."""
    firsts = {}
    for c in cases:
        firsts.setdefault(c.id.split("_")[0], c)
    return [c for c in cases if c.subprocess_only or firsts[c.id.split("_")[0]] is c]


@pytest.mark.slow
@pytest.mark.parametrize("case", representatives(CASES), ids=lambda c: c.id)
def test_bad_input_cli_subprocess(case, tmp_path, fx):
    argv = case.build(tmp_path, fx)
    cmd = [sys.executable, "-m", "tinyrl.cli", *argv]
    if case.id == "disk_read_only":
        cmd = read_only_cmd(tmp_path, argv)

    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (case.limit_fsize, case.limit_fsize))

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)},
                          preexec_fn=limit if case.limit_fsize else None)
    if case.id == "disk_read_only" and os.geteuid() != 0:
        (tmp_path / "runs").chmod(0o755)
    assert "Traceback" not in proc.stderr, f"{case.id}:\n{proc.stderr[-3000:]}"
    after(case, tmp_path, proc.returncode, proc.stderr + proc.stdout)
