"""Which adapter of a run: latest, best, or a checkpoint's; and whether it changed since (pure reads).

A run folder holds its final `adapter/` (once it ends) and `checkpoints/step-NNNNNN/adapter` (the
last `train.keep_last` of them). The pages that load or evaluate an adapter offer:

    latest       the final adapter, else the latest checkpoint's
    best         the kept adapter (final or checkpoint) at the step where the smoothed reward_mean is highest
    step-NNNNNN  one checkpoint's

A fingerprint (size and modification time of the adapter's weights) tells whether an adapter folder
was rewritten since a result was measured on it (a resume that trained on rewrites `adapter/`).

>>> label_of("step-000008"), step_of("step-000012")
('checkpoint step 8', 12)
"""

from __future__ import annotations

from pathlib import Path

from tinyrl.apps import runs_view
from tinyrl.apps.charts import smooth
from tinyrl.apps.paths import inside
from tinyrl.apps.status import num

LATEST, BEST, FINAL = "latest", "best", "adapter"
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def step_of(name: str) -> int | None:
    digits = name.removeprefix("step-")
    return int(digits) if digits.isdigit() else None


def label_of(key: str) -> str:
    """The words for an adapter key: `adapter` (the final one) or `step-NNNNNN`."""
    return "final adapter" if key == FINAL else f"checkpoint step {step_of(key)}"


def kept(run: Path) -> dict[str, Path]:
    """Key -> adapter folder of every adapter the run holds: `adapter` (final), then checkpoints newest first."""
    run = Path(run)
    found = {}
    for key, path in [(FINAL, run / "adapter")] + [(c.name, c / "adapter") for c in reversed(runs_view.checkpoints(run))]:
        if (path / "adapter_config.json").is_file() and inside(path, run):
            found[key] = path
    return found


def final_step(run: Path) -> int | None:
    """The step the final adapter was saved at: the last metrics row's."""
    rows = runs_view.metrics(run)
    return rows[-1].get("step") if rows else None


def best_key(run: Path) -> str | None:
    """The kept adapter whose step has the highest smoothed reward_mean (None: no adapter, or no rewards)."""
    rows = [(r["step"], v) for r in runs_view.metrics(run) if (v := num(r.get("reward_mean"))) is not None]
    if not rows:
        return None
    smoothed = dict(zip([s for s, _ in rows], smooth([v for _, v in rows])))
    steps = {key: final_step(run) if key == FINAL else step_of(key) for key in kept(run)}
    scored = [(smoothed[s], -i, key) for i, (key, s) in enumerate(steps.items()) if s in smoothed]
    return max(scored)[2] if scored else None


def choices(run: Path) -> list[tuple[str, str]]:
    """(shown, key) of the adapters a page can pick: latest, best, then each kept one."""
    have = kept(run)
    if not have:
        return []
    latest = next(iter(have))
    out = [(f"latest ({label_of(latest)})", LATEST)]
    if (best := best_key(run)) is not None:
        out.append((f"best reward ({label_of(best)})", BEST))
    return out + [(label_of(k) + (f", step {final_step(run)}" if k == FINAL else ""), k) for k in have]


def resolve(run: Path, choice: str | None) -> tuple[str, Path]:
    """(key, adapter folder) of a choice; FileNotFoundError when the run holds no such adapter (any more)."""
    have = kept(run)
    key = choice or LATEST
    if key == LATEST:
        key = next(iter(have), None)
    elif key == BEST:
        key = best_key(run)
    if key is None or key not in have:
        what = "no adapter yet (neither adapter/ nor a checkpoint)" if not have else \
            f"no {label_of(choice) if choice not in (LATEST, BEST) else choice} adapter any more"
        raise FileNotFoundError(f"run {Path(run).name!r}: {what}")
    return key, have[key]


def fingerprint(adapter: Path) -> str | None:
    """`size:mtime_ns` of the adapter's weights (None when it has none): it changes when the folder is rewritten."""
    for name in WEIGHTS:
        try:
            s = (Path(adapter) / name).stat()
        except OSError:
            continue
        return f"{s.st_size}:{s.st_mtime_ns}"
    return None
