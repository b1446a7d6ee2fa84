"""Trackers (log.report_to): each one's offline output, read back with the tracker's own reader, holds
the run's step metrics, config, sample tables, alarms and held-out results; a resume continues the
same tracker run; a tracker that fails never stops training and warns once, naming the fix.

Every tracker here runs offline: TensorBoard event files, wandb's offline mode (WANDB_MODE=offline),
trackio's local SQLite store (TRACKIO_DIR in a temp folder). Nothing reaches a network.
"""

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tinyrl.api import train
from tinyrl.config import load_config
from tinyrl.errors import ConfigError
from tinyrl.runs import read_jsonl
from tinyrl.trackers import TRACKERS
from tinyrl.trackers.base import Tracker
from tinyrl.trackers.fanout import STATE_FILE, open_trackers

ROOT = Path(__file__).resolve().parents[1]


def small(model, run_root, name, **extra):
    o = {"model.name": model, "log.run_dir": run_root, "log.name": name, "log.progress": False,
         "train.steps": 2, "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 8,
         "rollout.max_new_tokens": 4, "data.num_train": 64, "data.num_eval": 8, "train.lr": 1e-2,
         "log.samples_every": 1, "monitor.truncation_max": 0.0}  # the truncation alarm fires at step 2: an event to the trackers
    o.update(extra)
    return o


def metric_rows(run_path: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(run_path / "metrics.jsonl")}


def summary(run_path: Path) -> dict:
    return json.loads((run_path / "summary.json").read_text())


# --------------------------------------------------------------------------- TensorBoard


def test_tensorboard_event_files_hold_the_run_and_a_resume_replaces_what_followed_its_checkpoint(
        tiny_model_dir, run_root):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = train(**small(tiny_model_dir, run_root, "tb", **{"log.report_to": ["tensorboard"], "train.steps": 3,
                                                           "train.save_every": 2}))
    state = json.loads((run.path / STATE_FILE).read_text())["tensorboard"]
    assert state["dir"] == str(run.path / "tensorboard") and "tensorboard --logdir" in state["command"]

    def events():
        ea = EventAccumulator(str(run.path / "tensorboard"))
        ea.Reload()
        return ea

    ea, rows, s = events(), metric_rows(run.path), summary(run.path)
    assert [e.step for e in ea.Scalars("loss")] == [1, 2, 3]
    for key in ("loss", "reward_mean", "step_time"):
        assert [e.value for e in ea.Scalars(key)] == pytest.approx([rows[k][key] for k in (1, 2, 3)], rel=1e-6)
    held = {e.step: e.value for e in ea.Scalars("held_out/accuracy")}
    assert held == pytest.approx({0: s["eval_before"], 3: s["eval_after"]})
    tensors = ea.Tags()["tensors"]
    assert "config/text_summary" in tensors and "samples/text_summary" in tensors
    assert any(t.startswith("alarms/truncation") for t in tensors)
    table = ea.Tensors("samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| step | prompt | completion | reward") and len(table.splitlines()) == 2 + 4  # header + 4 rows

    # the run dies after its step-2 checkpoint, having logged step 3: the resume logs step 3 again, once
    shutil.rmtree(run.path / "checkpoints" / "step-000003")
    shutil.rmtree(run.path / "adapter")
    train(resume=run.path)
    ea = events()
    assert [e.step for e in ea.Scalars("loss")] == [1, 2, 3]
    assert [e.value for e in ea.Scalars("loss")] == pytest.approx([r["loss"] for r in metric_rows(run.path).values()],
                                                                  rel=1e-6)


# --------------------------------------------------------------------------- wandb


def wandb_records(path: Path) -> list:
    """The records of a wandb offline run file (run-<id>.wandb): wandb's LevelDB-style log of protobuf
    `Record`s, as its own writer lays it out (a 7-byte ':W&B' header, then 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        buf = chunk if kind in (1, 2) else buf + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def wandb_run(folder: Path) -> dict:
    """One offline-run folder read back: run id, config, history rows by step, alert titles."""
    (f,) = folder.glob("run-*.wandb")
    out = {"id": None, "config": {}, "history": {}, "alerts": []}
    for r in wandb_records(f):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["id"] = r.run.run_id
            out["config"] = {i.key: json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            out["history"].setdefault(row["_step"], {}).update(row)
        elif kind == "alert":
            out["alerts"].append(r.alert.title)
    return out


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """wandb offline, its settings and caches in tmp (nothing in the home folder, no network). wandb reads
    the environment into a process-wide setup once: torn down around each test, it reads this test's."""
    import wandb

    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    wandb.teardown()
    yield
    wandb.teardown()


def test_wandb_offline_run_holds_the_run_and_a_resume_continues_its_id(tiny_model_dir, run_root, wandb_offline):
    run = train(**small(tiny_model_dir, run_root, "wb", **{"log.report_to": ["wandb"], "train.save_every": 1}))
    state = json.loads((run.path / STATE_FILE).read_text())["wandb"]
    assert state["mode"] == "offline" and state["command"].startswith("wandb sync ")
    first = wandb_run(Path(state["dir"]))
    assert first["id"] == state["id"]
    assert first["config"]["train"]["steps"] == 2 and first["config"]["log"]["report_to"] == ["wandb"]
    rows, s = metric_rows(run.path), summary(run.path)
    for step in (1, 2):
        got = first["history"][step]
        assert got["loss"] == pytest.approx(rows[step]["loss"]) and got["reward_mean"] == pytest.approx(
            rows[step]["reward_mean"])
        assert got["samples/_type"] == "table-file" and got["samples/nrows"] == 4
    assert first["history"][0]["held_out/accuracy"] == pytest.approx(s["eval_before"])
    assert first["history"][2]["held_out/accuracy"] == pytest.approx(s["eval_after"])
    assert "truncation" in first["alerts"]

    train(resume=run.path, **{"train.steps": 3})
    again = json.loads((run.path / STATE_FILE).read_text())["wandb"]
    assert again["id"] == state["id"] and again["dir"] != state["dir"]  # the same run, a second offline session
    second = wandb_run(Path(again["dir"]))
    assert second["id"] == state["id"]
    assert second["history"][3]["loss"] == pytest.approx(metric_rows(run.path)[3]["loss"])
    assert 1 not in second["history"] and 2 not in second["history"]


# --------------------------------------------------------------------------- trackio

TRACKIO_SCRIPT = textwrap.dedent("""
    import json, sys
    from tinyrl.api import train
    overrides, resume_steps = json.loads(sys.argv[1]), int(sys.argv[2])
    run = train(**overrides)
    first = json.loads((run.path / "tracker.json").read_text())["trackio"]
    train(resume=run.path, **{"train.steps": resume_steps})
    state = json.loads((run.path / "tracker.json").read_text())["trackio"]
    from trackio.sqlite_storage import SQLiteStorage as S
    logs = S.get_logs(state["project"], state["name"])
    print("RESULT " + json.dumps({"first": first, "state": state, "runs": S.get_runs(state["project"]),
                                  "records": S.get_run_records(state["project"]),
                                  "logs": [{k: v for k, v in r.items() if k != "timestamp"} for r in logs],
                                  "config": S.get_run_config(state["project"], state["name"]),
                                  "alerts": S.get_alerts(state["project"], state["name"])}, default=str))
""")


@pytest.mark.slow  # a fresh interpreter, two tiny runs (a run and its resume): 8 s idle, 30 s on loaded cores
def test_trackio_store_holds_the_run_and_a_resume_continues_it(tiny_model_dir, run_root, tmp_path):
    """In a process of its own: trackio fixes its store's folder (TRACKIO_DIR) when first imported."""
    store = tmp_path / "trackio-store"
    o = small(tiny_model_dir, run_root, "tk", **{"log.report_to": ["trackio"], "train.save_every": 1,
                                                 "log.tracker_project": "tinyrl-test"})
    env = {**os.environ, "TRACKIO_DIR": str(store), "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    p = subprocess.run([sys.executable, "-c", TRACKIO_SCRIPT, json.dumps(o), "3"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    state, run_path = got["state"], Path(run_root) / "tk"
    assert state["dir"] == str(store) and (store / "tinyrl-test.db").is_file()
    assert got["first"]["id"] == state["id"] and got["runs"] == ["tk"]  # one run, continued
    assert [r["id"] for r in got["records"]] == [state["id"]]
    rows, s = metric_rows(run_path), summary(run_path)
    by_step: dict[int, dict] = {}
    for r in got["logs"]:
        by_step.setdefault(r["step"], {}).update(r)
    for step in (1, 2, 3):
        assert by_step[step]["loss"] == pytest.approx(rows[step]["loss"])
        assert by_step[step]["reward_mean"] == pytest.approx(rows[step]["reward_mean"])
        assert "samples" in by_step[step]
    assert by_step[0]["held_out/accuracy"] == pytest.approx(s["eval_before"])
    assert by_step[3]["held_out/accuracy"] == pytest.approx(s["eval_after"])
    assert got["config"]["train"]["save_every"] == 1
    assert "truncation" in {a["title"] for a in got["alerts"]}


# --------------------------------------------------------------------------- failures never stop a run


class Broken(Tracker):
    """A tracker whose every call raises (as one with no network would)."""

    fix = "FIX-THE-BROKEN-TRACKER"

    def _fail(self, *a, **kw):
        raise ConnectionError("no route to host")

    log_metrics = log_config = log_event = log_table = finish = state = _fail


def tracker_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tinyrl.trackers" and r.levelno >= logging.WARNING]


def test_a_tracker_that_raises_on_every_call_warns_once_and_the_run_trains(tiny_model_dir, run_root, monkeypatch,
                                                                           caplog):
    monkeypatch.setitem(TRACKERS, "broken", Broken)
    with caplog.at_level(logging.INFO):
        run = train(**small(tiny_model_dir, run_root, "broken", **{"log.report_to": ["broken"]}))
    assert [m["step"] for m in run.metrics] == [1, 2] and (run.path / "adapter" / "adapter_config.json").is_file()
    (warning,) = tracker_warnings(caplog)
    assert "broken failed in" in warning and "FIX-THE-BROKEN-TRACKER" in warning and "no route to host" in warning
    # every call counted: config, state (at open and close), held-out before and after, metrics and samples
    # table at steps 1 and 2, the truncation alarm at step 2, finish
    assert json.loads((run.path / STATE_FILE).read_text())["broken"]["errors"] == 1 + 2 + 2 + 2 * 2 + 1 + 1


def test_a_tracker_that_is_not_installed_warns_once_naming_the_extra(tiny_model_dir, run_root, monkeypatch, caplog):
    """wandb is installed here: its absence is made with sys.modules (`import wandb` then raises ImportError)."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    with caplog.at_level(logging.INFO):
        run = train(**small(tiny_model_dir, run_root, "absent", **{"log.report_to": ["wandb"],
                                                                   "train.eval_before_after": False}))
    assert len(run.metrics) == 2 and (run.path / "adapter" / "adapter_config.json").is_file()
    (warning,) = tracker_warnings(caplog)
    assert 'pip install "tinyrl-rlvr[wandb]"' in warning and "opening its run" in warning


def test_wandb_without_a_login_logs_offline(tiny_model_dir, run_root, wandb_offline, monkeypatch, caplog):
    """Online asked for, the host reachable, no API key: wandb refuses; the run logs offline. The host is a
    socket listening on localhost (WANDB_BASE_URL), so the reachability probe passes with no network."""
    import socket

    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("NETRC", str(Path(run_root).parent / "no-netrc"))
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as server, caplog.at_level(logging.WARNING):
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        run = train(**small(tiny_model_dir, run_root, "nologin", **{"log.report_to": ["wandb"],
                                                                    "train.eval_before_after": False}))
    assert not any("cannot be reached" in r.getMessage() for r in caplog.records)
    state = json.loads((run.path / STATE_FILE).read_text())["wandb"]
    assert state["mode"] == "offline" and wandb_run(Path(state["dir"]))["history"][2]["loss"] == pytest.approx(
        run.metrics[1]["loss"])
    assert any("wandb login" in r.getMessage() and "offline" in r.getMessage() for r in caplog.records)


def test_wandb_with_a_key_but_no_network_logs_offline_at_once(tmp_path, wandb_offline, monkeypatch, caplog):
    """A key, online asked for (no WANDB_MODE), and a wandb host that cannot be reached: offline within
    seconds, said once, not after wandb's 90 s init_timeout. The host is WANDB_BASE_URL under .invalid,
    which never resolves (RFC 2606), so this holds on a machine with a network too; no proxy in between."""
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "f" * 40)  # a key of the right shape that no server ever sees
    monkeypatch.setenv("WANDB_BASE_URL", "https://api.wandb.invalid")
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    _, cfg = load_config(None, {"log.report_to": ["wandb"]})
    run = tmp_path / "run"
    run.mkdir()
    with caplog.at_level(logging.INFO):
        t0 = time.monotonic()
        trackers = open_trackers(cfg, run)
        took = time.monotonic() - t0
        trackers.log_step(1, {"step": 1, "loss": 0.5}, [], [])
        trackers.close()
    assert took < 15, f"wandb took {took:.1f} s to start offline"
    state = json.loads((run / STATE_FILE).read_text())["wandb"]
    assert state["mode"] == "offline" and "errors" not in state
    assert wandb_run(Path(state["dir"]))["history"][1]["loss"] == 0.5
    (said,) = tracker_warnings(caplog)
    assert "https://api.wandb.invalid cannot be reached" in said and "logging offline" in said and "wandb sync" in said


def test_the_reachability_probe_is_bounded_even_when_the_lookup_hangs(monkeypatch):
    """A listening port is reachable, a closed one is not (real sockets on localhost); a name lookup that
    never returns (the network: a boundary faked here with an Event) costs the probe's timeout, no more."""
    import socket
    import threading

    from tinyrl.trackers import wandb_tracker

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert wandb_tracker.reachable(f"https://127.0.0.1:{port}", timeout=5)
    assert not wandb_tracker.reachable(f"https://127.0.0.1:{port}", timeout=5)  # closed now: refused at once
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    release = threading.Event()

    def lookup_that_hangs(*a, **kw):
        release.wait()
        raise OSError("no answer")

    monkeypatch.setattr(wandb_tracker.socket, "create_connection", lookup_that_hangs)
    try:
        t0 = time.monotonic()
        assert not wandb_tracker.reachable("https://api.wandb.ai", timeout=0.5)
        assert 0.5 <= time.monotonic() - t0 < 5
    finally:
        release.set()


def test_trackio_store_that_is_a_file_is_a_counted_failure_naming_the_fix(tmp_path):
    """TRACKIO_DIR naming a file: trackio itself would start and lose every metric (issue 49). Now the
    tracker fails to open: one warning naming the fix, the failure counted in tracker.json, training
    goes on. In a fresh interpreter: trackio reads TRACKIO_DIR when first imported."""
    code = textwrap.dedent("""
        import sys
        from tinyrl.config import load_config
        from tinyrl.trackers.fanout import open_trackers
        _, cfg = load_config(None, {"log.report_to": ["trackio"]})
        t = open_trackers(cfg, sys.argv[1])
        t.log_step(1, {"step": 1, "loss": 0.5}, [], [])
        t.close()
    """)
    store, run = tmp_path / "not-a-folder", tmp_path / "run"
    store.write_text("a file")
    run.mkdir()
    p = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "TRACKIO_DIR": str(store)})
    assert p.returncode == 0, p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if "log.report_to: trackio" in ln]
    assert len(said) == 1 and f"TRACKIO_DIR={store} is a file, not a folder" in said[0]
    assert "Fix: point TRACKIO_DIR at a writable folder" in said[0]
    assert json.loads((run / STATE_FILE).read_text()) == {"trackio": {"errors": 1}}
    assert store.read_text() == "a file"


# --------------------------------------------------------------------------- config and import


def test_an_unknown_tracker_names_the_allowed_values(tiny_model_dir, run_root):
    with pytest.raises(ConfigError, match=r"log\.report_to\[1\].*\['tensorboard', 'trackio', 'wandb'\].*'mlflow'"):
        train(**small(tiny_model_dir, run_root, "bad", **{"log.report_to": ["wandb", "mlflow"]}))
    assert load_config(None, {"log.report_to": "wandb"})[1].log.report_to == ["wandb"]  # one name: a list of it
    with pytest.raises(ConfigError, match=r"log\.samples_every"):
        train(**small(tiny_model_dir, run_root, "bad", **{"log.samples_every": -1}))


def test_no_tracker_is_imported_when_report_to_is_empty(tmp_path):
    code = textwrap.dedent("""
        import sys
        from tinyrl.config import load_config
        from tinyrl.trackers.fanout import open_trackers
        _, cfg = load_config(None, {})
        assert cfg.log.report_to == []
        assert not open_trackers(cfg, sys.argv[1])
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("wandb", "trackio", "tensorboard")
                     or m.startswith(("torch.utils.tensorboard", "tinyrl.trackers."))))
    """)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "['tinyrl.trackers.base', 'tinyrl.trackers.fanout', " \
                                                "'tinyrl.trackers.guard', 'tinyrl.trackers.registry']"


# --------------------------------------------------------------------------- the UI


def test_the_ui_links_to_the_trackers_run(tmp_path):
    """The Runs view's status names where the trackers show the run (tracker.json, written by the fan-out)."""
    pytest.importorskip("gradio")
    from tinyrl.apps.handlers import App
    from tinyrl.trackers.fanout import open_trackers

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  steps: 4\n")
    _, cfg = load_config(None, {"log.report_to": ["tensorboard"]})
    trackers = open_trackers(cfg, run)
    trackers.log_step(1, {"step": 1, "loss": 0.5}, [], [])
    trackers.close()
    app = App(tmp_path)
    status = app.run_view("r")[0][0]
    assert f"tensorboard: `tensorboard --logdir {run / 'tensorboard'}`" in status
    (run / STATE_FILE).write_text(json.dumps({"wandb": {"id": "abc", "url": "https://wandb.ai/me/tinyrl/runs/abc"}}))
    assert "[wandb](https://wandb.ai/me/tinyrl/runs/abc)" in app.run_view("r")[0][0]


def test_only_rank_0_opens_trackers(tmp_path):
    """Other ranks of a multi-process run get an empty fan-out: no tracker run, nothing written."""
    from tinyrl.trackers.fanout import open_trackers

    _, cfg = load_config(None, {"log.report_to": ["tensorboard"]})
    other = open_trackers(cfg, tmp_path / "r1", is_main=False)
    other.log_step(1, {"step": 1, "loss": 0.5}, [], [])
    other.close()
    assert not other and not (tmp_path / "r1").exists()
    main = open_trackers(cfg, tmp_path / "r0", is_main=True)
    main.close()
    assert main and (tmp_path / "r0" / "tensorboard").is_dir() and (tmp_path / "r0" / STATE_FILE).is_file()


def test_sft_logs_its_steps_to_the_trackers(tmp_path):
    """`tinyrl sft` (TRL's SFTTrainer) hands each logged step to log.report_to, as GRPO does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tinyrl.cli import main

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)}) + "\n"
                            for a in range(10, 40) for b in (11, 23)))
    code = main(["sft", "tiny_sft_cpu", f"data={rows}", f"log.run_dir={tmp_path / 'runs'}", "log.name=sft",
                 "sft.max_steps=3", "sft.batch_size=8", "data.num_eval=8", "log.progress=false",
                 "log.report_to=tensorboard"])
    assert code == 0
    run = tmp_path / "runs" / "sft"
    ea = EventAccumulator(str(run / "tensorboard"))
    ea.Reload()
    logged = {e.step: e.value for e in ea.Scalars("loss")}
    written = {m["step"]: m["loss"] for m in read_jsonl(run / "metrics.jsonl")}
    assert list(written) == [1, 2, 3] and logged == pytest.approx(written, rel=1e-6)
    assert "tensorboard" in json.loads((run / STATE_FILE).read_text())
