"""Trackers that hang: time-boxed calls (tinyrl/trackers/guard.py through the fan-out).

The hanging tracker is a fake (a tracker's server is a boundary we do not own and cannot reach): its
call blocks on an Event the test holds, so "stuck" is certain, not a matter of timing; the test frees
it when it chooses. The boxes are short (BOX s) and every wait on a thread is on an Event. Nothing here
trains a model: the fan-out is driven as the trainer drives it.
"""

import json
import logging
import threading
import time

import pytest

from tinyrl.config import load_config
from tinyrl.trackers import TRACKERS
from tinyrl.trackers.base import Tracker
from tinyrl.trackers.fanout import STATE_FILE, Trackers, open_trackers

BOX = 1.0  # the call box of these tests, s: far above what a healthy in-memory call takes


class Recorder(Tracker):
    """A healthy tracker: keeps every call in memory."""

    fix = "nothing to fix"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.calls = []

    def log_metrics(self, metrics, step):
        self.calls.append(("metrics", step, dict(metrics)))

    def log_config(self, config, step):
        self.calls.append(("config", step))

    def log_event(self, name, text, step, level="warn"):
        self.calls.append(("event", step, name))

    def log_table(self, name, columns, rows, step):
        self.calls.append(("table", step, name))

    def finish(self):
        self.calls.append(("finish",))

    def state(self):
        return {"dir": "memory"}


class Hanging(Recorder):
    """log_metrics at step `hang_at` blocks until `release` is set (a server that never answers)."""

    fix = "FIX-THE-HANGING-TRACKER"
    hang_at = 1
    instances: list = []

    def __init__(self, ctx):
        super().__init__(ctx)
        self.entered, self.release = threading.Event(), threading.Event()
        Hanging.instances.append(self)

    def log_metrics(self, metrics, step):
        super().log_metrics(metrics, step)
        if step == self.hang_at:
            self.entered.set()
            self.release.wait()


class HangsOnOpen(Recorder):
    fix = "FIX-THE-OPEN"
    release = threading.Event()

    def __init__(self, ctx):
        HangsOnOpen.release.wait()
        super().__init__(ctx)


@pytest.fixture
def fakes(monkeypatch):
    for name, cls in (("recorder", Recorder), ("hanging", Hanging), ("hangs_on_open", HangsOnOpen)):
        monkeypatch.setitem(TRACKERS, name, cls)
    Hanging.instances = []
    HangsOnOpen.release = threading.Event()
    yield
    for t in Hanging.instances:  # free every stuck thread, whatever the test did
        t.release.set()
    HangsOnOpen.release.set()


def opened(tmp_path, names, **boxes):
    _, cfg = load_config(None, {"log.report_to": names})
    return open_trackers(cfg, tmp_path, **{"call_s": BOX, "close_s": 2 * BOX, **boxes})


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tinyrl.trackers" and r.levelno >= logging.WARNING]


def test_a_hanging_call_costs_one_box_then_its_calls_are_dropped_until_it_returns(tmp_path, fakes, caplog):
    trackers = opened(tmp_path, ["hanging", "recorder"])
    hanging, recorder = trackers.trackers
    with caplog.at_level(logging.INFO):
        t0 = time.monotonic()
        trackers.log_step(1, {"step": 1, "loss": 1.0}, [], [])  # hanging blocks here
        first = time.monotonic() - t0
        assert hanging.entered.is_set() and not hanging.release.is_set()  # it is stuck, for certain
        t0 = time.monotonic()
        for step in range(2, 12):  # while it is stuck: nothing waits for it, nothing queues up for it
            trackers.log_step(step, {"step": step, "loss": float(step)}, [], [])
        later = time.monotonic() - t0
    assert BOX <= first < BOX + 5 and later < 5 * BOX  # not a box each (10 s): none waits for hanging
    assert [c[1] for c in hanging.calls] == [0, 1]  # config, then the stuck step: no later call reached it
    assert [c[1] for c in recorder.calls if c[0] == "metrics"] == list(range(1, 12))  # the other one lost nothing
    (warning,) = warnings_of(caplog)
    assert "hanging did not answer within 1 s in log_metrics" in warning and "FIX-THE-HANGING-TRACKER" in warning
    assert trackers.errors == {"hanging": 11} and trackers.timeouts == {"hanging": 1}  # 1 abandoned + 10 dropped

    hanging.release.set()  # the server answers at last
    assert trackers.slots[0][1].settle(5 * BOX)
    with caplog.at_level(logging.INFO):
        trackers.log_step(12, {"step": 12, "loss": 12.0}, [], [])
    assert hanging.calls[-1] == ("metrics", 12, {"loss": 12.0})  # its calls go through again
    assert any("hanging answered again" in r.getMessage() for r in caplog.records)
    trackers.close()
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["hanging"] == {"dir": "memory", "errors": 11, "timeouts": 1}
    assert state["recorder"] == {"dir": "memory"} and ("finish",) in hanging.calls


def test_a_tracker_stuck_for_good_cannot_hold_up_the_end_of_the_run(tmp_path, fakes):
    trackers = opened(tmp_path, ["hanging", "recorder"], close_s=BOX)
    hanging, recorder = trackers.trackers
    trackers.held_out(0.5, 0)
    trackers.log_step(1, {"step": 1, "loss": 1.0}, [], [])
    t0 = time.monotonic()
    trackers.close()  # hanging never returns: the close waits at most its box, then leaves it
    assert time.monotonic() - t0 < BOX + 5
    assert ("finish",) in recorder.calls and ("finish",) not in hanging.calls
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["hanging"]["timeouts"] == 1 and state["hanging"]["errors"] == 3  # step 1, then finish and state dropped
    assert trackers.closed  # later calls do nothing and wait for nothing
    trackers.log_step(2, {"step": 2, "loss": 2.0}, [], [])
    assert [c[1] for c in recorder.calls if c[0] == "metrics"] == [0, 1]


def test_a_tracker_that_hangs_while_opening_is_left_out_within_its_box(tmp_path, fakes, caplog):
    with caplog.at_level(logging.WARNING):
        t0 = time.monotonic()
        trackers = opened(tmp_path, ["hangs_on_open", "recorder"], open_s=BOX)
        took = time.monotonic() - t0
    assert BOX <= took < BOX + 5 and [t.name for t in trackers.trackers] == ["recorder"]
    (warning,) = warnings_of(caplog)
    assert "hangs_on_open did not answer within 1 s in opening its run" in warning and "FIX-THE-OPEN" in warning
    trackers.close()
    assert json.loads((tmp_path / STATE_FILE).read_text())["hangs_on_open"] == {"errors": 1, "timeouts": 1}


def test_a_tracker_opened_elsewhere_gets_its_thread_too(tmp_path):
    """Trackers([...]) given open trackers (as a caller with its own tracker would): every call still
    runs on the tracker's own thread, never the caller's."""
    from tinyrl.trackers.base import TrackerContext

    class Where(Recorder):
        def log_metrics(self, metrics, step):
            self.calls.append(threading.current_thread().name)

    t = Where(TrackerContext("p", "r", tmp_path, {}))
    t.name = "where"
    trackers = Trackers([t], tmp_path, call_s=BOX)
    trackers.held_out(0.25, 0)
    trackers.close()
    assert t.calls == ["tinyrl-tracker-where", ("finish",)]


def test_pass_at_k_and_lm_eval_results_reach_the_trackers(tmp_path):
    """held_out_sampled (summary.json's details.eval_sampled[when]) and benchmark_results ({task: {metric:
    value}}), read back from TensorBoard's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, cfg = load_config(None, {"log.report_to": ["tensorboard"]})
    trackers = open_trackers(cfg, tmp_path)
    before = {"samples": 4, "temperature": 1.0, "k": [1, 4], "pass@k": {"1": 0.25, "4": 0.5},
              "maj@k": {"1": 0.25, "4": 0.375}, "maj_note": None}
    after = {**before, "pass@k": {"1": 0.5, "4": 0.75}, "maj@k": None, "maj_note": "answers are free text"}
    trackers.held_out_sampled(before, 0)
    trackers.held_out_sampled(after, 3)
    trackers.held_out_sampled(None, 3)  # not measured: nothing sent
    trackers.benchmark_results({"gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.125,
                                          "exact_match_stderr,strict-match": "N/A"}}, 3)
    trackers.close()
    ea = EventAccumulator(str(tmp_path / "tensorboard"))
    ea.Reload()
    got = {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}
    assert got == ({"held_out/pass@1": {0: 0.25, 3: 0.5}, "held_out/pass@4": {0: 0.5, 3: 0.75},
                    "held_out/maj@1": {0: 0.25}, "held_out/maj@4": {0: 0.375},
                    "lm_eval/gsm8k/exact_match,strict-match": {3: 0.125}})  # exact in float32
