"""Monitor calibration: no alarm on the healthy shipped presets, every alarm on the broken ones.

    nice -n 10 python benchmarks/monitor_calibration.py [--out DIR] [--seeds 0 1 2 3 4 5] [--jobs 2]
                                                        [--cases tiny_grpo_cpu tiny_kl_blowup_cpu ...] [--json F]
    python benchmarks/monitor_calibration.py --replay DIR     # no training: re-run the monitor
    python benchmarks/monitor_calibration.py --replay DIR --export tests/data/monitor/broken  # traces for the tests
    python benchmarks/monitor_calibration.py --smoke [--json F]  # the whole path in about a minute (SMOKE)

The default --cases are the tiny-arith presets (a 100-step healthy run is ~2 min on a free core,
~13 min on a loaded 2-core box); the SmolLM2 preset (~20 s per step on 2 cores, 40 steps; its
entropy_collapse alarm fires near step 30 while it learns) runs when named: --cases smollm2-135m_grpo_cpu.

Runs every case (a shipped preset and a seed; one child process each, one torch thread) into
DIR (default runs/monitor-calibration; a case whose run folder already finished is not run
again), then replays each run's metrics.jsonl through a fresh `Monitor` built from the
preset's `monitor` section over the current `MonitorConfig` defaults: what the monitor would
say now, so thresholds can be tuned offline against saved traces (`--replay DIR`). The live
run's own alarms.jsonl is what the monitor said then; the replay is what it says with the
code as it is.

Prints:
  - the confusion table: case x rule -> the first step the rule fired (w: a warning, not an
    alarm), with the case's damage step where the rule promises to fire before damage;
  - the checks: healthy cases raise zero alarms (warnings are listed, not counted); each broken
    preset raises its alarm, before its damage step where promised;
  - headroom: for the quantities the thresholds test, the most extreme value seen on the
    healthy runs next to the threshold.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve()
SMOLLM = "smollm2-135m_grpo_cpu"


# --------------------------------------------------------------------------- damage


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _series(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) else 0.0 for r in rows]


def reward_collapse(key: str = "reward_mean", k: int = 3, frac: float = 0.5) -> Callable[[list[dict]], Optional[int]]:
    """Damage = the first step whose k-step mean of `key` is below frac x the mean of the first k
    steps (the same definition as tests/test_monitor.py's reward_collapse_step)."""
    def damage(rows: list[dict]) -> Optional[int]:
        r = _series(rows, key)
        early = _mean(r[:k])
        return next((rows[i]["step"] for i in range(k, len(r)) if _mean(r[i - k + 1:i + 1]) < frac * early), None)
    damage.__doc__ = f"{key}: {k}-step mean < {frac:g} x its first {k} steps"
    return damage


def share_at_least(key: str, share: float) -> Callable[[list[dict]], Optional[int]]:
    """Damage = the first step whose `key` (a fraction) reaches `share`."""
    def damage(rows: list[dict]) -> Optional[int]:
        return next((r["step"] for r in rows if isinstance(r.get(key), (int, float)) and r[key] >= share), None)
    damage.__doc__ = f"{key} >= {share:g}"
    return damage


def first_step_after(step: int, what: str) -> Callable[[list[dict]], Optional[int]]:
    def damage(rows: list[dict]) -> Optional[int]:
        return step if any(r["step"] >= step for r in rows) else None
    damage.__doc__ = f"step {step}: {what}"
    return damage


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    preset: str
    expect: tuple[str, ...] = ()  # the alarms this broken preset must raise (empty: healthy, none)
    damage: Optional[Callable[[list[dict]], Optional[int]]] = None  # when the harm shows
    before_damage: tuple[str, ...] = ()  # the expected alarms that promise to fire before it
    overrides: dict = field(default_factory=dict)
    seeds: Optional[tuple[int, ...]] = None  # without --seeds; None: 0-5
    name: str = ""  # the case's name where it is a preset with overrides (a broken variant); default the preset's

    def __post_init__(self):
        self.name = self.name or self.preset

    @property
    def healthy(self) -> bool:
        return not self.expect

    def damage_step(self, rows: list[dict]) -> Optional[int]:
        return self.damage(rows) if self.damage else None


CASES: dict[str, Case] = {
    "tiny_grpo_cpu": Case("tiny_grpo_cpu"),
    "tiny_sft_grpo_cpu": Case("tiny_sft_grpo_cpu"),  # the GRPO stage after an SFT cold start
    SMOLLM: Case(SMOLLM),
    "tiny_search_cpu": Case("tiny_search_cpu"),  # the search agent (multi-turn tools): the agent rules' healthy case
    "tiny_code_cpu": Case("tiny_code_cpu", seeds=(0, 1, 2)),  # code in the sandbox: rewards are shares of asserts
    "tiny_collapse_cpu": Case("tiny_collapse_cpu", ("lazy_likelihood",), reward_collapse(), ("lazy_likelihood",),
                              seeds=(0,)),
    "tiny_entropy_collapse_cpu": Case("tiny_entropy_collapse_cpu", ("entropy_collapse",), seeds=(0,)),
    "tiny_kl_blowup_cpu": Case("tiny_kl_blowup_cpu", ("kl_blowup",), reward_collapse(), ("kl_blowup",), seeds=(0,)),
    # step 2's update is the first on stale samples (the monitor reads a step after its update): the
    # canary promises to stop the run there, before a second one (step 3)
    "tiny_stale_weights_cpu": Case("tiny_stale_weights_cpu", ("stale_weights",),
                                   first_step_after(3, "a second update on stale samples"), ("stale_weights",),
                                   seeds=(0,)),
    # the task reward is lost first (the policy pads its answers inside the cap, step ~14); the rule
    # reads truncation, and promises to fire while completions grow into the cap, before nearly
    # all of them are cut (>= 90%: no answer left to read)
    "tiny_length_explosion_cpu": Case("tiny_length_explosion_cpu", ("length_explosion",),
                                      share_at_least("truncated_frac", 0.9), ("length_explosion",), seeds=(0,)),
    "tiny_advantage_collapse_cpu": Case("tiny_advantage_collapse_cpu", ("advantage_collapse",), seeds=(0,)),
}
# The real model broken on purpose (issue 50): the SmolLM2 preset with the tiny presets' faults as overrides, each
# cut to the steps it needs (~14 s a step on 2 cores). Named, never in the default --cases.
SMOLLM_BROKEN = {
    "smollm2-stale": Case(SMOLLM, ("stale_weights",), first_step_after(3, "a second update on stale samples"),
                          ("stale_weights",), {"rollout.engine": "stale", "train.steps": 6}, (0,)),
    # lm_head-only LoRA at a high rate, clipping off: the head sharpens onto the answers it already gives
    "smollm2-entropy": Case(SMOLLM, ("entropy_collapse",), None, (),
                            {"lora.target_modules": ["lm_head"], "train.lr": 4e-2, "train.max_grad_norm": 1e6,
                             "train.steps": 30}, (0,)),
    "smollm2-kl": Case(SMOLLM, ("kl_blowup",), reward_collapse(), ("kl_blowup",),
                       {"algo.beta": 0.04, "train.lr": 2e-2, "train.warmup_steps": 10, "train.steps": 30}, (0,)),
    "smollm2-collapse": Case(SMOLLM, ("lazy_likelihood",), reward_collapse(), ("lazy_likelihood",),
                             {"train.lr": 5e-3, "train.max_grad_norm": 1e6, "train.steps": 20}, (0,)),
    "smollm2-length": Case(SMOLLM, ("length_explosion",), share_at_least("truncated_frac", 0.9), ("length_explosion",),
                           {"reward.functions": ["task", {"name": "tinyrl.rewards.broken:pays_for_length", "weight": 8.0,
                                                          "kwargs": {"max_chars": 160}}],
                            "monitor.reward_max": 9.0, "train.steps": 30}, (0,)),
    # five-digit sums of three numbers, the task reward alone: a 135M model gets none right, so no group has a spread
    "smollm2-too-hard": Case(SMOLLM, ("advantage_collapse",), None, (),
                             {"reward.functions": ["task"], "data.task_args.min_digits": 5, "data.task_args.max_digits": 5,
                              "data.task_args.min_terms": 3, "data.task_args.max_terms": 3, "train.steps": 12}, (0,)),
}
CASES.update({name: replace(c, name=name) for name, c in SMOLLM_BROKEN.items()})

# --smoke (seed 0, a fresh temporary --out unless one is given): one healthy run cut to 3 steps and one broken
# preset that ends itself within 3 steps (the stale-weights canary stops it), so every part (runs, replay,
# confusion table, checks, headroom, JSON) runs on a real pass and a real alarm
SMOKE = {"tiny_grpo_cpu": {"train.steps": 3}, "tiny_stale_weights_cpu": {}}


# --------------------------------------------------------------------------- running


def run_name(case: Case, seed: int) -> str:
    return f"{case.name}-s{seed}"


def child(spec: dict) -> None:
    """One run in this process (the --child entry point): one torch thread, no held-out eval."""
    import torch

    torch.set_num_threads(1)
    import tinyrl
    from tinyrl.errors import StaleWeightsError

    out = Path(spec["out"])
    try:
        tinyrl.train(spec["preset"], **{"train.seed": spec["seed"], "log.run_dir": str(out), "log.name": spec["name"],
                                       "log.progress": False, "train.eval_before_after": False, **spec["overrides"]})
    except StaleWeightsError as e:  # the canary stopping a run is the expected end of the stale preset
        print(f"stopped: {e}", flush=True)
    (out / spec["name"] / "case.json").write_text(json.dumps(spec))


def metrics_file(path: Path) -> Path:
    """The run's metrics.jsonl; a staged run (stages: [sft, grpo]) keeps the RL stage's, which is
    the one the monitor watched, in stages/NN-grpo/ (tinyrl/methods/chain.py)."""
    staged = sorted(path.glob("stages/*-grpo/metrics.jsonl"))
    return staged[-1] if staged else path / "metrics.jsonl"


def finished(path: Path) -> bool:
    return (path / "case.json").exists() and metrics_file(path).exists()


def run_cases(cases: list[tuple[Case, int]], out: Path, jobs: int) -> None:
    todo = [(c, s) for c, s in cases if not finished(out / run_name(c, s))]
    print(f"{len(cases) - len(todo)} of {len(cases)} runs already in {out}; running {len(todo)} ({jobs} at a time)",
          flush=True)

    def one(item):
        case, seed = item
        spec = {"preset": case.preset, "case": case.name, "seed": seed, "overrides": case.overrides,
                "name": run_name(case, seed), "out": str(out)}
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, str(HERE), "--child", json.dumps(spec)], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        status = "ok" if p.returncode == 0 else f"FAILED rc={p.returncode}: {p.stderr.strip()[-400:]}"
        print(f"  {spec['name']:<36} {time.perf_counter() - t0:6.0f} s  {status}", flush=True)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo))


# --------------------------------------------------------------------------- replay


def case_of(spec: dict) -> str:
    """The case a run folder is of (traces written before cases had names: the preset's)."""
    return spec.get("case", spec["preset"])


def finished_runs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if finished(p)) if out.is_dir() else []


def replay(path: Path) -> tuple[dict, list[dict], list[dict]]:
    """(case spec, metrics rows, what the monitor raises on them now: Alarm dicts)."""
    from tinyrl.config import load_config
    from tinyrl.monitor import Monitor
    from tinyrl.runs import read_jsonl

    spec = json.loads((path / "case.json").read_text())
    _, cfg = load_config(spec["preset"], dict(spec["overrides"]))
    rows = [r for r in read_jsonl(metrics_file(path)) if "step" in r]
    mon = Monitor(cfg.monitor)
    fired = []
    for r in rows:
        fired += [a.__dict__ for a in mon.update(r["step"], {k: v for k, v in r.items() if k != "step"})]
    return spec, rows, fired



# --------------------------------------------------------------------------- headroom


def _rolling(xs: list[float], n: int) -> list[float]:
    return [_mean(xs[i - n + 1:i + 1]) for i in range(n - 1, len(xs))]


def _spike_ratios(rows: list[dict], key: str, c) -> list[tuple[float, float]]:
    """(value, value / rolling median) at each step the monitor's spike test looks at."""
    out = []
    for i in range(len(rows)):
        past = [r[key] for r in rows[max(0, i - c.median_window):i]
                if isinstance(r.get(key), (int, float)) and not r.get("skipped_no_signal")]
        x = rows[i].get(key)
        if isinstance(x, (int, float)) and len(past) >= c.window:
            med = sorted(past)[len(past) // 2]
            out.append((x, x / med if med > 0 else math.inf))
    return out


def _worst_spike(rows, key, c, factor):
    """The largest value among steps whose ratio to the median exceeds `factor` (0 if none), and
    the largest ratio among steps above the absolute floor's half: how close the two-sided test came."""
    pts = _spike_ratios(rows, key, c)
    return max([v for v, q in pts if q > factor], default=0.0)


def _echo_drop(rows, c) -> float:
    """The largest fall of the within-group reward std, window median vs the window before."""
    s = _series(rows, "reward_group_std")
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    w = c.window
    drops = [1 - med(s[i - w:i]) / med(s[i - 2 * w:i - w]) for i in range(2 * w, len(s) + 1) if med(s[i - 2 * w:i - w]) > 0]
    return max(drops, default=0.0)


# (label, value on one run's rows, "max"|"min": the direction that approaches the threshold, threshold)
HEADROOM: list[tuple[str, Callable, str, Callable]] = [
    ("entropy / early value", lambda r, c: min([e / _mean(_series(r, "entropy")[:c.baseline_steps])
                                                       for e in _series(r, "entropy")], default=math.nan),
     "min", lambda c: c.entropy_collapse_frac),
    ("entropy (nats)", lambda r, c: min(_series(r, "entropy")), "min", lambda c: c.entropy_collapse_abs),
    ("zero_std_frac, window mean", lambda r, c: max(_rolling(_series(r, "zero_std_frac"), c.window), default=0),
     "max", lambda c: c.zero_std_max),
    ("frac_pos_delta_nonpos, mean", lambda r, c: max(_rolling(_series(r, "frac_pos_delta_nonpos"),
                                                              c.lld_nonpos_steps), default=0),
     "max", lambda c: c.lld_nonpos_frac),
    ("-logp_pos_delta, mean", lambda r, c: max([-x for x in _rolling(_series(r, "logp_pos_delta"),
                                                                    c.lld_nonpos_steps)], default=-math.inf),
     "max", lambda c: c.lld_delta_floor),
    ("group std drop (window medians)", lambda r, c: _echo_drop(r, c), "max", lambda c: c.echo_drop),
    ("grad_norm where > factor x median", lambda r, c: _worst_spike(r, "grad_norm", c, c.grad_explosion_factor),
     "max", lambda c: c.grad_explosion_floor),
    ("grad_norm / median", lambda r, c: max([q for _, q in _spike_ratios(r, "grad_norm", c)], default=0),
     "max", lambda c: c.grad_explosion_factor),
    ("update_kl where > factor x median", lambda r, c: _worst_spike(r, "update_kl", c, c.update_kl_factor),
     "max", lambda c: c.update_kl_floor),
    ("update_kl / median", lambda r, c: max([q for _, q in _spike_ratios(r, "update_kl", c)], default=0),
     "max", lambda c: c.update_kl_factor),
    ("update_kl (the ceiling)", lambda r, c: max(_series(r, "update_kl")), "max", lambda c: c.update_kl_max),
    ("update_clip_frac where > factor x median",
     lambda r, c: _worst_spike(r, "update_clip_frac", c, c.clip_frac_factor), "max", lambda c: c.clip_frac_floor),
    ("update_clip_frac", lambda r, c: max(_series(r, "update_clip_frac")), "max", lambda c: c.clip_frac_floor),
    ("rollout_trainer_k3 (step >= 2)", lambda r, c: max(_series(r[1:], "rollout_trainer_k3"), default=0),
     "max", lambda c: c.stale_k3),
    ("truncated_frac, window mean", lambda r, c: max(_rolling(_series(r, "truncated_frac"), c.window), default=0),
     "max", lambda c: c.truncation_max),
]


# --------------------------------------------------------------------------- tables


def confusion(results: list[tuple[dict, list[dict], list[dict]]], cases: dict) -> list[str]:
    from tinyrl.monitor import RULES

    names = list(RULES)
    short = {n: n.replace("_", " ")[:9] for n in names}
    head = f"{'case':<34} {'steps':>5} {'damage':>6} " + " ".join(f"{short[n]:>9}" for n in names)
    lines = [head, "-" * len(head)]
    for spec, rows, fired in results:
        case = cases.get(case_of(spec))
        dmg = case.damage_step(rows) if case else None
        first: dict[str, str] = {}
        for a in fired:
            first.setdefault(a["name"], f"{a['step']}{'w' if a.get('severity') == 'warning' else ''}")
        cells = " ".join(f"{first.get(n, '-'):>9}" for n in names)
        lines.append(f"{spec['name']:<34} {len(rows):>5} {dmg if dmg is not None else '-':>6} {cells}")
    lines.append("cells: first step the rule fired (w: a warning, not an alarm); -: never. damage: see the checks.")
    return lines


def checks(results, cases) -> tuple[list[str], bool]:
    lines, ok = [], True
    for spec, rows, fired in results:
        case = cases.get(case_of(spec))
        if case is None:
            continue
        alarms = [a for a in fired if a.get("severity", "alarm") == "alarm"]
        warns = sorted({f"{a['name']}@{a['step']}" for a in fired if a.get("severity") == "warning"})
        if case.healthy:
            good = not alarms
            what = "no alarm" if good else "ALARMS: " + ", ".join(f"{a['name']}@{a['step']}: {a['evidence']}" for a in alarms)
            lines.append(f"  {'ok ' if good else 'BAD'} {spec['name']}: {what}" + (f" (warnings, not alarms: {', '.join(warns)})" if warns else ""))
            ok &= good
            continue
        dmg = case.damage_step(rows)
        first = {}
        for a in alarms:
            first.setdefault(a["name"], a["step"])
        for name in case.expect:
            step = first.get(name)
            promise = name in case.before_damage
            good = step is not None and (not promise or dmg is None or step < dmg)
            if promise and dmg is None:
                note = f"damage ({case.damage.__doc__}) not reached in {len(rows)} steps"
            elif promise:
                note = f"damage at step {dmg} ({case.damage.__doc__})"
            else:
                note = "no before-damage promise"
            lines.append(f"  {'ok ' if good else 'BAD'} {spec['name']}: {name} "
                         f"{'at step ' + str(step) if step is not None else 'did NOT fire'}; {note}")
            ok &= good
    return lines, ok


def headroom(results, cases) -> list[str]:
    from tinyrl.config import load_config

    healthy = [(spec, rows) for spec, rows, _ in results if cases.get(case_of(spec)) and cases[case_of(spec)].healthy]
    if not healthy:
        return []
    lines = [f"  {'quantity':<44} {'threshold':>10} {'worst healthy':>14}  run"]
    for label, fn, way, thr in HEADROOM:
        vals = []
        for spec, rows in healthy:
            c = load_config(spec["preset"], dict(spec["overrides"]))[1].monitor
            v = fn(rows, c)
            if not math.isnan(v):
                vals.append((v, spec["name"], thr(c)))
        if vals:
            v, name, t = (max if way == "max" else min)(vals)
            lines.append(f"  {label:<44} {t:>10.4g} {v:>14.4g}  {name}")
    return lines


def report(out: Path, json_path: Optional[str]) -> tuple[bool, list[tuple[dict, list[dict], list[dict]]]]:
    """Print the tables and checks for the finished runs in OUT; (whether every check passed, the replays)."""
    runs = finished_runs(out)
    if not runs:
        print(f"no finished runs in {out}")
        return False, []
    results = [replay(p) for p in runs]
    order = {n: i for i, n in enumerate(CASES)}
    results.sort(key=lambda x: (order.get(case_of(x[0]), 99), x[0]["seed"]))
    print("\nconfusion table (the monitor replayed over each run's metrics.jsonl, current thresholds):\n")
    print("\n".join(confusion(results, CASES)))
    lines, ok = checks(results, CASES)
    print("\nchecks:")
    print("\n".join(lines))
    hr = headroom(results, CASES)
    if hr:
        print("\nheadroom on the healthy runs (the threshold a rule tests vs the closest healthy value):")
        print("\n".join(hr))
    print(f"\nresult: {'all checks pass' if ok else 'SOME CHECKS FAIL'}")
    if json_path:
        Path(json_path).write_text(json.dumps([{"case": s, "fired": f, "steps": len(r)} for s, r, f in results], indent=1))
    return ok, results


def export(results: list[tuple[dict, list[dict], list[dict]]], dest: Path) -> None:
    """Write each replayed run's metrics rows to DEST/<run>.jsonl, for the tests to replay; a broken case also gets
    its entry in DEST/cases.json (its preset, overrides, the alarms it must raise and its damage step), merged
    with the entries already there."""
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / "cases.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for spec, rows, _ in results:
        (dest / f"{spec['name']}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        case = CASES.get(case_of(spec))
        if case is not None and not case.healthy:
            manifest[f"{spec['name']}.jsonl"] = {
                "preset": spec["preset"], "overrides": spec["overrides"], "expect": list(case.expect),
                "before_damage": list(case.before_damage), "damage_step": case.damage_step(rows),
                "damage": case.damage.__doc__ if case.damage else None}
        print(f"  exported {spec['name']} ({len(rows)} steps) to {dest}")
    if manifest:
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


def export_dest(value: str) -> Path:
    """--export's folder, checked before any run starts: a name, not an existing file (a FIFO, a device), and a
    cases.json there that is a JSON object of cases (the export merges into it)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("needs a folder name, got an empty one")
    dest = Path(value)
    if any(len(os.fsencode(part)) > 255 for part in dest.parts):
        raise argparse.ArgumentTypeError(f"a name in {value[:60]!r}... is over 255 bytes")
    if dest.exists() and not dest.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} exists and is not a folder")
    manifest = dest / "cases.json"
    if manifest.exists() or manifest.is_symlink():
        if not manifest.is_file():
            raise argparse.ArgumentTypeError(f"{manifest} is not a regular file")
        try:
            cases = json.loads(manifest.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise argparse.ArgumentTypeError(f"{manifest} cannot be read as JSON: {e}") from None
        if not isinstance(cases, dict):
            raise argparse.ArgumentTypeError(f"{manifest} holds a {type(cases).__name__}, not an object of cases")
    return dest


def finish(out: Path, json_path: Optional[str], export_to: Optional[Path]) -> bool:
    """Report on the runs in OUT, export their traces where asked; whether every check passed."""
    ok, results = report(out, json_path)
    if export_to is not None:
        export(results, export_to)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--out", default=None, help="default runs/monitor-calibration (--smoke: a temporary folder)")
    ap.add_argument("--smoke", action="store_true", help="seed 0 of " + " and ".join(SMOKE) + ", in about a minute")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=[n for n in CASES if CASES[n].preset != SMOLLM])
    ap.add_argument("--seeds", type=int, nargs="+",
                    help="seeds for every case (default: 0-5 for the healthy presets, each broken preset's own)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--replay", metavar="DIR", help="no training: replay the monitor over the runs in DIR")
    ap.add_argument("--json")
    ap.add_argument("--export", metavar="DEST", type=export_dest, help="also copy the runs' traces (and broken cases' specs) to DEST, "
                                                      "e.g. tests/data/monitor/broken for the replay tests")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    export_to = args.export
    if args.replay:
        sys.exit(0 if finish(Path(args.replay), args.json, export_to) else 1)
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="tinyrl-monitor-smoke-") as tmp:
            out = Path(args.out or tmp)
            run_cases([(replace(CASES[n], overrides={**CASES[n].overrides, **o}), 0) for n, o in SMOKE.items()],
                      out, args.jobs)
            ok = finish(out, args.json, export_to or out / "traces")  # the tests' traces, as a user makes them
        sys.exit(0 if ok else 1)
    out = Path(args.out or "runs/monitor-calibration")
    cases = [(CASES[n], s) for n in args.cases for s in (args.seeds or CASES[n].seeds or range(6))]
    run_cases(cases, out, args.jobs)
    sys.exit(0 if finish(out, args.json, export_to) else 1)


if __name__ == "__main__":
    main()
