"""Every CPU benchmark of tinyrl in one go, ending with one combined table.

    python benchmarks/run_all.py              # vs TRL (4 cases, A B A B), scaling table, fused-loss --quick
    python benchmarks/run_all.py --quick      # short run: a few minutes
    python benchmarks/run_all.py --smoke      # the whole path in a minute or two (vs_trl.py / fused_loss.py --smoke)
    python benchmarks/run_all.py --json /tmp/all.json --loss-args --n 1024 4096

Parts, each in fresh processes (see their own docstrings):
  benchmarks/vs_trl.py      tinyrl vs TRL GRPOTrainer on the same GRPO runs, and the scaling table
  benchmarks/fused_loss.py  GRPO loss forward+backward from hidden states: naive / liger / tinyrl
                            (run here with --quick unless --loss-args says otherwise)

The combined table has one row per (benchmark, config, metric): tinyrl's figure, the other
side's (TRL, or the naive loss), their ratio, and the target where the issue sets one
(step time <= 0.5x TRL, peak RSS <= 0.6x TRL; every scaling cell <= 1.0x), the ratio being the
median over A/B pairs of each pair's ratio, with its range. Time: about 25 minutes on 2 quiet cores
(3 pairs per case and scaling point).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import vs_trl  # noqa: E402

LOSS_ROW = re.compile(r"^\s*(\d+)\s+(naive|liger|ours-torch|ours-triton)\s+(\d+)\s+([\d.]+)\s")


def run_fused_loss(extra: list[str], timeout: int) -> tuple[str, list[dict]]:
    cmd = [sys.executable, str(HERE / "fused_loss.py"), *extra]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"fused_loss.py timed out after {timeout} s", []
    text = r.stdout.strip() if r.returncode == 0 else f"fused_loss.py failed: {r.stderr.strip()[-300:]}"
    rows = []
    for line in r.stdout.splitlines():
        m = LOSS_ROW.match(line)
        if m:
            rows.append({"n": int(m[1]), "impl": m[2], "peak_mib": float(m[3]), "time_s": float(m[4])})
    return text, rows


def combined(cases: dict, scaling: list[dict], loss: list[dict], loss_vocab: str) -> str:
    rows = []  # (benchmark, config, metric, tinyrl, other, ratio, target)

    def add(bench, cfg, metric, a, b, target=None, other="TRL", fmt=".2f", pairs=None):
        """`pairs`: (median of the A/B pair ratios, (min, max), count) where the runs were paired; else
        the ratio of the two figures."""
        ratio = pairs[0] if pairs else (a / b if a is not None and b else None)
        verdict = "" if target is None or ratio is None else (f"<={target} " + ("ok" if ratio <= target else "MISS"))
        shown = f"{ratio:.2f}" if ratio else "-"
        if pairs:
            shown += f" [{pairs[1][0]:.2f}-{pairs[1][1]:.2f}] x{pairs[2]}"
        rows.append((bench, cfg, metric, format(a, fmt), f"{format(b, fmt)} {other}", shown, verdict))

    def paired(res, key):
        return (res[key], res[key + "_range"], res["pairs"]) if key in res else None

    for name, res in cases.items():
        a, b = res["tinyrl"], res["trl"]
        if "error" in a or "error" in b:
            rows.append(("vs-trl", name, "error", a.get("error", "ok")[:40], b.get("error", "ok")[:40], "", ""))
            continue
        add("vs-trl", name, "step s", a["step_s"], b["step_s"], vs_trl.STEP_TARGET, pairs=paired(res, "step_ratio"))
        add("vs-trl", name, "tokens/s", a["tokens_per_s"], b["tokens_per_s"], fmt=".0f")
        add("vs-trl", name, "peak RSS MiB", a["peak_rss_mib"], b["peak_rss_mib"], vs_trl.RSS_TARGET, fmt=".0f",
            pairs=paired(res, "rss_ratio"))
        add("vs-trl", name, "train RSS MiB", a["peak_rss_mib"] - a["rss_setup_mib"],
            b["peak_rss_mib"] - b["rss_setup_mib"], fmt=".0f")
    for r in scaling:
        a, b = r["tinyrl"], r["trl"]
        if "error" in a or "error" in b:
            continue
        cfg = f"G={r['G']} L={r['L']}"
        add("scaling", cfg, "step s", a["step_s"], b["step_s"], 1.0, pairs=paired(r, "step_ratio"))
        add("scaling", cfg, "peak RSS MiB", a["peak_rss_mib"], b["peak_rss_mib"], fmt=".0f",
            pairs=paired(r, "rss_ratio"))
    naive = {r["n"]: r for r in loss if r["impl"] == "naive"}
    liger = {r["n"]: r for r in loss if r["impl"] == "liger"}
    for r in loss:
        if r["impl"] != "ours-torch":
            continue
        for ref, label in ((naive, "naive"), (liger, "liger")):
            if r["n"] in ref:
                cfg = f"N={r['n']} {loss_vocab}"
                add("fused-loss", cfg, "peak MiB", r["peak_mib"], ref[r["n"]]["peak_mib"], other=label, fmt=".0f")
                add("fused-loss", cfg, "time s", r["time_s"], ref[r["n"]]["time_s"], other=label)
    head = ("benchmark", "config", "metric", "tinyrl", "other", "ratio", "target")
    widths = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    fmt_row = lambda x: "  ".join(str(v).rjust(w) if i >= 3 else str(v).ljust(w)  # noqa: E731
                                  for i, (v, w) in enumerate(zip(x, widths)))
    line = "-" * len(fmt_row(head))
    return "\n".join([fmt_row(head), line] + [fmt_row(x) for x in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short run: tiny-lora once, 2 scaling points, small loss")
    p.add_argument("--smoke", action="store_true", help="the whole path in a minute or two: each part's --smoke")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--loss-args", nargs=argparse.REMAINDER, default=None,
                   help="arguments for fused_loss.py (default --quick; with --quick: --quick --n 512)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--repeats", type=int, default=3, help="A/B pairs per vs-TRL case and scaling point (--quick: 1)")
    p.add_argument("--json", help="also write every measurement here")
    args = p.parse_args()
    t0 = time.perf_counter()
    print("## 1-2. tinyrl vs TRL GRPOTrainer, and the scaling table (benchmarks/vs_trl.py)", flush=True)
    mode = ["--smoke"] if args.smoke else ["--quick"] if args.quick else ["--repeats", str(args.repeats)]
    vs = vs_trl.main(mode + ["--threads", str(args.threads), "--timeout", str(args.timeout)])
    loss_args = args.loss_args if args.loss_args is not None else (
        ["--smoke"] if args.smoke else ["--quick", "--n", "512"] if args.quick else ["--quick"])
    print(f"\n## 3. fused GRPO loss (benchmarks/fused_loss.py {' '.join(loss_args)})", flush=True)
    text, loss = run_fused_loss(loss_args, args.timeout)
    print(text)
    if args.json:  # before the table, so a table bug never costs the measurements
        Path(args.json).write_text(json.dumps({**vs, "fused_loss": loss, "fused_loss_text": text}, indent=1))
    vocab = re.search(r"V=(\d+)", text)
    print(f"\n## combined ({time.perf_counter() - t0:.0f} s in all; machine: {args.threads} threads)")
    print(combined(vs["cases"], vs["scaling"], loss, f"V={vocab[1]}" if vocab else ""))
    print("ratio = tinyrl / other: for vs-TRL and scaling rows the median over A/B pairs of each pair's ratio, "
          "[range] x pairs; targets from issues 9 and 21 (step <= 0.5x and peak RSS <= 0.6x TRL per case, every "
          "scaling cell <= 1.0x). Timings on a shared machine are noisy: see the per-repeat figures above.")


if __name__ == "__main__":
    main()
