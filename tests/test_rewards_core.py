"""The rewards API: TRL signature, weights, per-component values, failures counted not raised."""

import math
import re

import pytest
import torch

from tinyrl.config import RewardSpec
from tinyrl.rewards.core import RewardImportError, RewardSet, resolve_reward


def exact(prompts, completions, answer, **kw):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def length_bonus(prompts, completions, **kw):
    return [len(c) / 10 for c in completions]


def boom(prompts, completions, **kw):
    raise RuntimeError("verifier crashed")


def sometimes_none(prompts, completions, **kw):
    return [None if c == "x" else 1.0 for c in completions]


def score(specs, completions=("4", "5", "x"), answers=("4", "4", "4")):
    rs = RewardSet([RewardSpec(f"{__name__}:{n}", w) for n, w in specs])
    cols = [{"answer": a} for a in answers]
    return rs, rs.score(["2+2="] * len(completions), list(completions), cols)


def test_weighted_sum_and_components():
    _, (total, comps, report) = score([("exact", 1.0), ("length_bonus", 0.5)])
    assert torch.allclose(comps["exact"], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(total, torch.tensor([1.05, 0.05, 0.05]))
    assert report.failures == {} and report.excluded == 0


def test_raising_reward_is_counted_and_excluded_not_raised():
    rs, (total, comps, report) = score([("exact", 1.0), ("boom", 1.0)])
    assert report.failures == {"boom": 3} and "verifier crashed" in report.errors["boom"]
    assert torch.isnan(total).all() and report.excluded == 3
    assert rs.total_failures["boom"] == 3


def test_none_excludes_only_that_sample():
    _, (total, _, report) = score([("sometimes_none", 1.0)])
    assert total[:2].tolist() == [1.0, 1.0] and math.isnan(total[2])
    assert report.failures == {"sometimes_none": 1}


def test_wrong_length_is_a_failure():
    def short(prompts, completions, **kw):
        return [1.0]

    rs = RewardSet([])
    rs.components = [("short", short, 1.0)]
    total, _, report = rs.score(["p", "p"], ["a", "b"], [{}, {}])
    assert report.failures == {"short": 2} and torch.isnan(total).all()


def test_normalize_then_sum():
    rs = RewardSet([RewardSpec(f"{__name__}:length_bonus", 1.0)], combine="normalize_then_sum")
    total, _, _ = rs.score(["p"] * 3, ["a", "aa", "aaa"], [{}] * 3)
    assert torch.allclose(total, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-4)


def test_resolve_errors_are_clear():
    with pytest.raises(RewardImportError, match="cannot import 'no.such.module:f'"):
        resolve_reward("no.such.module:f")
    with pytest.raises(RewardImportError, match="unknown reward 'nope'"):
        resolve_reward("nope")


def test_sum_then_normalize():
    rs = RewardSet([RewardSpec(f"{__name__}:length_bonus", 1.0), RewardSpec(f"{__name__}:length_bonus", 1.0)],
                   combine="sum_then_normalize")
    total, comps, _ = rs.score(["p"] * 3, ["a", "aa", "aaa"], [{}] * 3)
    assert set(comps) == {"length_bonus", "length_bonus_2"}
    assert torch.allclose(total, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-4)


# --------------------------------------------------------------------------- bad returns, exits, hangs


def test_inf_is_a_failure_like_nan_and_non_numbers_too():
    def odd(prompts, completions, **kw):
        return [float("inf"), float("-inf"), float("nan"), "1.0", 0.5]

    rs = RewardSet([])
    rs.components = [("odd", odd, 1.0)]
    total, comps, report = rs.score(["p"] * 5, list("abcde"), [{}] * 5)
    assert torch.isnan(comps["odd"][:4]).all() and comps["odd"][4] == 0.5
    assert report.failures == {"odd": 4} and report.excluded == 4
    assert not torch.isinf(total).any()


@pytest.mark.parametrize("value, why", [
    ({"a": 1.0, "b": 0.0}, "dict"),
    ([[1.0], [0.0]], "2-D"),
    ([(1.0, 0.0), (0.0, 1.0)], "2-D"),
    ("10", "str"),
    (None, "NoneType"),
    (torch.ones(2, 1), "shape"),
])
def test_a_dict_or_2d_return_is_rejected_whole(value, why):
    rs = RewardSet([])
    rs.components = [("bad", lambda prompts, completions, **kw: value, 1.0)]
    total, _, report = rs.score(["p", "p"], ["a", "b"], [{}, {}])
    assert report.failures == {"bad": 2} and torch.isnan(total).all()
    assert why in report.errors["bad"]


def test_a_1d_tensor_or_array_is_fine():
    import numpy as np

    for value in (torch.tensor([1.0, 0.0]), np.array([1.0, 0.0]), (True, False)):
        rs = RewardSet([])
        rs.components = [("ok", lambda prompts, completions, v=value, **kw: v, 1.0)]
        total, _, report = rs.score(["p", "p"], ["a", "b"], [{}, {}])
        assert total.tolist() == [1.0, 0.0] and report.failures == {}


def exits(prompts, completions, **kw):
    raise SystemExit(0)


def test_system_exit_from_a_reward_is_a_counted_failure_not_an_exit():
    rs, (total, _, report) = score([("exact", 1.0), ("exits", 1.0)])
    assert report.failures == {"exits": 3} and "SystemExit" in report.errors["exits"]
    assert torch.isnan(total).all()
    rs.timeout = None  # also when called directly on this thread
    total, _, report = rs.score(["p"] * 3, ["4", "5", "x"], [{"answer": "4"}] * 3)
    assert report.failures == {"exits": 3}


def test_keyboard_interrupt_from_a_reward_still_stops_the_run():
    def ctrl_c(prompts, completions, **kw):
        raise KeyboardInterrupt

    for timeout in (5.0, None):
        rs = RewardSet([], timeout=timeout)
        rs.components = [("ctrl_c", ctrl_c, 1.0)]
        with pytest.raises(KeyboardInterrupt):
            rs.score(["p"], ["a"], [{}])


def test_a_reward_process_works_where_sys_stderr_has_no_file_descriptor(monkeypatch):
    import io
    import sys

    # a notebook's stderr, pytest's capsys: the child's stack-dump handler must not need sys.stderr's descriptor
    # (it did, and every reward call in such a process failed: "exited with status 1")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    rs = RewardSet([], timeout=5.0, isolate=True)
    rs.components = [("exact", exact, 1.0)]
    try:
        total, _, report = rs.score(["p"] * 3, ["4", "5", "x"], [{"answer": "4"}] * 3)
        assert total.tolist() == [1.0, 0.0, 0.0] and not report.failures
    finally:
        rs.close()


@pytest.mark.parametrize("isolate", [True, False], ids=["own-process", "in-process"])
def test_a_hanging_reward_times_out_scores_none_and_the_rest_go_on(isolate, capfd):
    import threading
    import time

    release = threading.Event()

    def hangs(prompts, completions, **kw):
        release.wait(60)  # a verifier stuck on an adversarial input
        return [1.0] * len(completions)

    def slow_but_ok(prompts, completions, **kw):
        time.sleep(0.3)
        return [2.0] * len(completions)

    rs = RewardSet([], timeout=1.0, isolate=isolate)
    rs.components = [("hangs", hangs, 1.0), ("slow", slow_but_ok, 1.0)]
    t0 = time.monotonic()
    total, comps, report = rs.score(["p"] * 2, ["a", "b"], [{}, {}])
    elapsed = time.monotonic() - t0
    try:
        assert 1.0 <= elapsed < 10, elapsed  # waited for the timeout, not for the hang
        assert torch.isnan(comps["hangs"]).all() and comps["slow"].tolist() == [2.0, 2.0]
        assert report.timeouts == {"hangs": 1} and report.failures == {"hangs": 2}
        assert "reward.timeout=1" in report.errors["hangs"] and rs.total_failures["hangs"] == 2
        # its own process is killed; in-process, a thread cannot be: it is left behind
        left = any(t.name == "tinyrl-reward" and t.daemon and t.is_alive() for t in threading.enumerate())
        assert left is not isolate and ("its process was stopped" in report.errors["hangs"]) is isolate
        if isolate:  # before the kill, the stuck process says where it stood: the reward's own line
            err = capfd.readouterr().err
            assert "past reward.timeout=1 s; its stacks" in err and re.search(r'test_rewards_core\.py", line \d+ in hangs', err)
    finally:
        release.set()
        rs.close()


def test_where_a_reward_runs():
    """In its own process (forked once, kept: no fork per call), on that process's main thread; in-process
    (reward.isolate: false) on a thread, or on this thread when there is no timeout."""
    import os
    import threading

    def where(prompts, completions, **kw):
        return [float(os.getpid()), float(threading.current_thread() is threading.main_thread())]

    rs = RewardSet([], timeout=5.0)
    rs.components = [("where", where, 1.0)]
    first = rs.score(["p"] * 2, ["a", "b"], [{}] * 2)[1]["where"].tolist()
    again = rs.score(["p"] * 2, ["a", "b"], [{}] * 2)[1]["where"].tolist()
    assert first[0] != os.getpid() and first[1] == 1.0 and again == first  # the same process, still alive
    rs.close()
    for timeout, on_main in ((None, 1.0), (5.0, 0.0)):
        rs = RewardSet([], timeout=timeout, isolate=False)
        rs.components = [("where", where, 1.0)]
        assert rs.score(["p"] * 2, ["a", "b"], [{}] * 2)[1]["where"].tolist() == [os.getpid(), on_main]



def test_start_forks_the_rewards_process_before_a_worker_thread_calls_it():
    """`start()` forks on the calling thread (partial rollouts score from a worker: a fork from there would
    copy locks other threads hold); a call from the worker then uses that process; a dead one is replaced."""
    import os
    import signal
    import time
    from concurrent.futures import ThreadPoolExecutor

    def where(prompts, completions, **kw):
        return [float(os.getpid())] * len(completions)

    rs = RewardSet([], timeout=5.0)
    rs.components = [("where", where, 1.0)]
    rs.start()
    pid = rs._process.pid
    rs.start()
    assert pid is not None and rs._process.pid == pid  # one process, not one per start
    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(lambda: rs.score(["p"], ["a"], [{}])[1]["where"].tolist()).result()
    assert got == [float(pid)]
    os.kill(pid, signal.SIGKILL)
    while not rs._process._ended():  # (the kill lands asynchronously)
        time.sleep(0.01)
    rs.start()
    assert rs._process.pid not in (None, pid)
    rs.close()

def exits_hard(prompts, completions, **kw):
    import os

    os._exit(3)  # no exception, no cleanup: today's trainer would end with rc 3 and no message


def segfaults(prompts, completions, **kw):
    import ctypes

    ctypes.string_at(0)  # a crash in native code: SIGSEGV


def allocates_forever(prompts, completions, **kw):
    hoard = []
    while True:
        hoard.append(bytearray(32 << 20))


@pytest.mark.parametrize("reward, says", [
    ("exits_hard", "exited with status 3"),
    ("segfaults", "killed by SIGSEGV"),
    ("allocates_forever", "MemoryError"),
])
def test_a_reward_that_kills_its_process_costs_the_call_not_the_run(reward, says, monkeypatch):
    """os._exit, a segfault or a runaway allocation in a reward: the call's samples are excluded and
    counted under the reward's name, the run goes on, and the next call gets a fresh process."""
    import tinyrl.rewards.isolation as isolation

    monkeypatch.setattr(isolation, "MEMORY_SHARE", 256 / (isolation.host_memory() >> 20))  # 256 MiB more
    rs = RewardSet([RewardSpec(f"{__name__}:exact", 1.0), RewardSpec(f"{__name__}:{reward}", 1.0)])
    for _ in range(2):  # the process it ended is replaced
        total, comps, report = rs.score(["2+2="] * 3, ["4", "5", "x"], [{"answer": "4"}] * 3)
        assert report.failures == {reward: 3} and says in report.errors[reward], report.errors
        assert comps["exact"].tolist() == [1.0, 0.0, 0.0] and torch.isnan(total).all()
    assert rs.total_failures[reward] == 6
    rs.close()


def test_inputs_that_do_not_pickle_fail_that_call_and_name_the_way_out():
    rs = RewardSet([RewardSpec(f"{__name__}:length_bonus", 1.0)])
    total, _, report = rs.score(["p"], ["a"], [{"helper": lambda: 0}])  # a column the reward's process cannot get
    assert report.failures == {"length_bonus": 1} and "reward.isolate=false" in report.errors["length_bonus"]
    assert RewardSet([RewardSpec(f"{__name__}:length_bonus", 1.0)], isolate=False).score(
        ["p"], ["a"], [{"helper": lambda: 0}])[0].tolist() == [pytest.approx(0.1)]
    rs.close()


def test_failures_are_logged_rate_limited(caplog):
    rs = RewardSet([RewardSpec(f"{__name__}:boom", 1.0)])
    with caplog.at_level("WARNING", logger="tinyrl.rewards"):
        for _ in range(250):
            rs.score(["p"], ["a"], [{}])
    lines = [r.getMessage() for r in caplog.records if "'boom'" in r.getMessage()]
    assert len(lines) == 3 + 2  # the first three, then the 100th and the 200th
    assert "verifier crashed" in lines[0] and "every 100th" in lines[-1]
    assert rs.total_failures["boom"] == 250


def test_per_sample_failures_are_logged_with_an_example(caplog):
    with caplog.at_level("WARNING", logger="tinyrl.rewards"):
        score([("sometimes_none", 1.0)])
    assert any("1 of 3 samples" in r.getMessage() and "sample 2" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- checked at load

NOT_CALLABLE = 3


def no_completions(prompts, answers):
    return [0.0] * len(prompts)


def named_columns_only(completions, answer):
    return [float(c == a) for c, a in zip(completions, answer)]


def test_reward_that_is_not_callable_or_has_the_wrong_signature_fails_at_load():
    with pytest.raises(RewardImportError, match="is a int, not a function"):
        RewardSet([RewardSpec(f"{__name__}:NOT_CALLABLE")])
    with pytest.raises(RewardImportError, match="must take `completions`"):
        RewardSet([RewardSpec(f"{__name__}:no_completions")])
    with pytest.raises(RewardImportError, match=r"does not take the kwargs \['scale'\]"):
        RewardSet([RewardSpec(f"{__name__}:named_columns_only", 1.0, {"scale": 2})])
    RewardSet([RewardSpec(f"{__name__}:exact", 1.0, {"anything": 1})])  # **kw takes any kwargs


def test_a_reward_without_kwargs_gets_only_the_columns_it_names():
    rs = RewardSet([RewardSpec(f"{__name__}:named_columns_only")])
    total, _, report = rs.score(["p", "p"], ["4", "5"], [{"answer": "4", "other": 1}] * 2, completion_ids=[[1], [2]])
    assert total.tolist() == [1.0, 0.0] and report.failures == {}
