"""Partial rollouts' metrics where the user sees them: the off-policy alarm, report.txt's "asynchronous
rollouts" block, the UI's off-policy panel; and the stale-weights canary staying quiet on stale-by-design steps."""

from __future__ import annotations

import json
import random

import pytest

from tinyrl.apps import charts
from tinyrl.config.schema_monitor import MonitorConfig
from tinyrl.monitor_rules import OFFPOLICY_ESS_MIN, RULES, offpolicy_drift, stale_weights
from tinyrl.report import render, write_report

N = 30


def async_run(seed: int = 0, n: int = N) -> list[dict]:
    """A healthy max_staleness=1 run: a third of the tokens one version old, weights close to even."""
    rng = random.Random(seed)
    rows = []
    for s in range(1, n + 1):
        old = 0.3 + 0.1 * (rng.random() - 0.5)
        rows.append({"step": s, "reward_mean": 0.3 + 0.01 * s, "staleness_mean": old, "staleness_max": 1,
                     "staleness/0": 1 - old, "staleness/1": old, "stale_dropped_groups": 0,
                     "carried_groups": 3, "train_groups": 8, "offpolicy_ess": 0.95 + 0.04 * rng.random(),
                     "offpolicy_capped_frac": 0.0, "rollout_trainer_k3": 0.01 * (1 + rng.random()),
                     "rollout_trainer_maxdiff": 0.5})
    return rows


def fired_at(rows: list[dict]) -> list[int]:
    cfg = MonitorConfig()
    return [r["step"] for i, r in enumerate(rows) if offpolicy_drift(rows[: i + 1], cfg) is not None]


# --------------------------------------------------------------------------- the monitor


def test_offpolicy_drift_is_quiet_on_a_healthy_async_run_and_on_a_synchronous_one():
    for seed in range(3):
        assert fired_at(async_run(seed)) == []
    sync = [{k: v for k, v in r.items() if not k.startswith("stale") and k != "carried_groups"} for r in async_run()]
    for r in sync:
        r["offpolicy_ess"] = 0.1  # even a terrible ESS is not this rule's on a run without staleness metrics
    assert fired_at(sync) == []


def test_offpolicy_drift_fires_when_the_effective_sample_size_falls():
    rows = async_run()
    for r in rows[14:]:
        r.update(offpolicy_ess=0.3, offpolicy_capped_frac=0.12, staleness_mean=1.6)
    window = MonitorConfig().window
    crossed = next(r["step"] for i, r in enumerate(rows) if i + 1 >= window
                   and sum(x["offpolicy_ess"] for x in rows[i + 1 - window: i + 1]) / window < OFFPOLICY_ESS_MIN)
    assert 15 < crossed < 15 + window and fired_at(rows)[0] == crossed  # the window mean, not one low step
    hit = offpolicy_drift(rows[:20], MonitorConfig())
    assert f"< {OFFPOLICY_ESS_MIN:g}" in hit.evidence and "12% of tokens above the cap" in hit.evidence
    assert "rollout.max_staleness" in hit.action and "algo.off_policy" in hit.action
    assert RULES["offpolicy_drift"].check is offpolicy_drift and RULES["offpolicy_drift"].severity == "alarm"


def test_offpolicy_drift_fires_on_a_sustained_share_of_stale_groups():
    rows = async_run()
    window = MonitorConfig().window
    for r in rows[10:]:
        r["stale_dropped_groups"] = 4  # 4 of 12 groups thrown away each step: 33% > 25%
    steps = fired_at(rows)
    assert steps and 11 <= steps[0] <= 10 + window
    hit = offpolicy_drift(rows, MonitorConfig())
    assert "33% of the groups were dropped" in hit.evidence
    one_off = async_run()
    one_off[12]["stale_dropped_groups"] = 4  # a single bad step: 4 of 8 * window + 4 groups, under the share
    assert fired_at(one_off) == []


def test_the_stale_weights_canary_ignores_steps_trained_on_stale_tokens():
    rows = async_run()  # k3 0.01-0.02 per token: far above the canary's limit, by design
    cfg = MonitorConfig()
    assert stale_weights(rows, cfg) is None
    sync = [dict(r, staleness_max=0) for r in rows]  # the same mismatch with nothing stale: the engine is wrong
    sync[0]["rollout_trainer_k3"] = 1e-6  # (step 1 samples from the weights both sides share: the noise floor)
    assert stale_weights(sync, cfg) is not None


# --------------------------------------------------------------------------- the report


def test_the_report_has_an_async_block_only_with_the_async_metrics(tmp_path):
    rows = async_run(n=4)
    for r, dropped in zip(rows, (0, 2, 1, 0)):
        r["stale_dropped_groups"] = dropped
        r["overlap_s"] = 1.5
    text = render(tmp_path, rows, [], None, png=False)
    block = text.split("asynchronous rollouts:\n")[1].split("\n\n")[0].splitlines()
    lines = {ln[:28].strip(): ln[28:].strip() for ln in block}
    mean_lag = sum(r["staleness_mean"] for r in rows) / 4
    assert lines["mean staleness"] == f"{mean_lag:.4g} policy versions (max 1)"
    assert lines["staleness histogram"].startswith(f"lag 0: {1 - mean_lag:.0%}  lag 1: {mean_lag:.0%}")
    assert lines["groups dropped (stale)"] == "3 in all, 0.75 per step"
    assert lines["groups carried over"] == "12 in all, 3 per step"
    assert lines["generation overlap (s)"] == "6 in all, 1.5 per step"
    ess = [r["offpolicy_ess"] for r in rows]
    assert lines["behaviour weights ESS"] == f"{sum(ess) / 4:.4g} mean (min {min(ess):.4g}, max {max(ess):.4g})"
    assert lines["weights above the cap"].startswith("0 of tokens mean")
    assert lines["behaviour-trainer KL (k3)"].endswith(")") and "per token" in lines["behaviour-trainer KL (k3)"]

    sync = [{k: v for k, v in r.items() if k in ("step", "reward_mean", "offpolicy_ess", "rollout_trainer_k3")}
            for r in rows]
    assert "asynchronous rollouts" not in render(tmp_path, sync, [], None, png=False)


def test_write_report_reads_the_async_metrics_from_the_run_folder(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in async_run(n=3)))
    text = write_report(tmp_path)
    assert "asynchronous rollouts:" in text and (tmp_path / "report.txt").read_text() == text


# --------------------------------------------------------------------------- the UI


def test_the_off_policy_panel_draws_staleness_and_the_effective_sample_size():
    rows = async_run(n=3)
    rows[1]["offpolicy_ess"] = None  # not measured: left out, never drawn as 0
    chart = charts.run_chart("off-policy", rows, [{"step": 2, "name": "offpolicy_drift", "evidence": "x"}])
    drawn = lambda s: [(p["step"], p["value"]) for p in chart.points if p["series"] == s]  # noqa: E731
    assert drawn("staleness_mean") == [(r["step"], r["staleness_mean"]) for r in rows]
    assert drawn("offpolicy_ess") == [(1, rows[0]["offpolicy_ess"]), (3, rows[2]["offpolicy_ess"])]
    assert drawn("rollout_trainer_k3") == [(r["step"], r["rollout_trainer_k3"]) for r in rows]
    assert "alarm: offpolicy_drift @ 2" in chart.colors  # the alarm marked on its panel
    assert {"staleness_mean", "offpolicy_ess"} <= {e.label for e in chart.legend}
    assert charts.frame(chart.points).dtypes.astype(str).tolist() == ["int64", "float64", "str"]
    assert charts.run_chart("off-policy", [{"step": 1, "reward_mean": 0.2}]).empty  # an old run: nothing drawn


def test_the_off_policy_panel_in_a_gradio_lineplot():
    gr = pytest.importorskip("gradio")
    chart = charts.run_chart("off-policy", async_run(n=4))
    plot = gr.LinePlot(x="step", y="value", color="series")
    data = plot.postprocess(chart.frame)
    assert data.datatypes == {"step": "quantitative", "value": "quantitative", "series": "nominal"}
    rows = [dict(zip(data.columns, d)) for d in data.data]
    assert len(rows) == len(chart.points) == 12  # 4 steps x staleness, ESS, KL (none of them smoothed)
    want = [x["staleness_mean"] for x in async_run(n=4)]  # the page rounds values for the wire
    assert [r["value"] for r in rows if r["series"] == "staleness_mean"] == pytest.approx(want, abs=1e-9)
