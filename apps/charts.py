"""The curves as the page draws them (pure: pandas, no gradio): one typed frame per panel, a
smoothed twin beside each noisy metric, the monitor's alarms as vertical marks, a colour per
series, the legend, and the step axis' range.

Why typed frames: gradio's LinePlot takes each column's type (quantitative / nominal) from the
first frame it draws; an empty frame of object columns makes `step` categorical for good. So every
frame has `step` int64, `value` float64 and `series` str, empty or not.

Why `colors` and `x_lim` travel apart from the frame: a LinePlot rebuilds its chart (series
domain, colours, axes) only when a setting such as `color_map` or `x_lim` changes, never when only
its data does; the page sends those settings after the data (ui.py), and they change exactly when
the set of series or the step range does.

Why the step axis is [0, a round number >= MIN_SPAN]: the axis gets about one tick per 40 px, and
a span at least that many steps wide keeps every tick on a whole step (panels are at most ~800 px).

Metric rows may lack any key or carry null (a quantity that was not measured): such points are
left out, never drawn as 0.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field

import pandas as pd

from tinyrl.apps.status import num

# Curve panels: title -> metric keys drawn on it ("reward/*" = every reward component present).
PANELS: dict[str, tuple[str, ...]] = {
    "reward": ("reward_mean", "reward/*"),
    "entropy": ("entropy",),
    "KL": ("update_kl", "ref_kl", "pass_kl"),
    "completion length": ("completion_len",),
    "zero-std fraction": ("zero_std_frac",),
    "clip fraction": ("clip_frac", "update_clip_frac"),
    "step time (s)": ("step_time", "gen_time"),
    "agent": ("tool_calls_per_traj", "turns_mean", "max_turns_frac", "obs_token_frac", "tool_error_rate"),
    # partial rollouts: how stale the trained tokens were (policy versions) and how even their behaviour
    # weights are (effective sample size, 1 = on-policy); the behaviour-vs-trainer KL beside them
    "off-policy": ("staleness_mean", "offpolicy_ess", "rollout_trainer_k3"),
}
# Panels a run has only with their metrics (agent runs; partial rollouts): the page may hide them when empty
OPTIONAL_PANELS = ("agent", "off-policy")
NOISY = ("reward_mean", "entropy", "update_kl", "completion_len", "zero_std_frac")  # drawn with a smoothed twin
SMOOTHING = 0.8  # weight of the debiased exponential moving average (TensorBoard's slider)
SMOOTHED = " (smoothed)"
# Where an alarm is marked besides the reward panel (every alarm is marked there).
ALARM_PANELS = {"entropy_collapse": "entropy", "echo_trap": "entropy", "advantage_collapse": "zero-std fraction",
                "kl_blowup": "KL", "stale_weights": "KL", "length_shortcut": "completion length",
                "length_explosion": "completion length", "truncation": "completion length",
                "tool_use_collapse": "agent", "tool_loop": "agent", "tool_errors": "agent",
                "offpolicy_drift": "off-policy"}
MIN_SPAN = 20
COLUMNS = ["step", "value", "series"]
DTYPES = {"step": "int64", "value": "float64", "series": "str"}
PALETTE = ("#4c78a8", "#54a24b", "#b279a2", "#72b7b2", "#9d755d", "#e0b000", "#ff9da6", "#17becf", "#7f7f7f",
           "#8c564b")  # no red or orange: those mark alarms and warnings
MARK_COLORS = {"alarm": "#d62728", "warning": "#f58518"}


# --------------------------------------------------------------------------- small pieces


def frame(points: list[dict]) -> pd.DataFrame:
    """Long-format points as the LinePlot's typed frame (the same dtypes when empty).

    >>> frame([]).dtypes.astype(str).tolist()
    ['int64', 'float64', 'str']
    """
    return pd.DataFrame(points, columns=COLUMNS).astype(DTYPES)


def smooth(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """Debiased exponential moving average: the first point is the first value, not pulled to 0.

    >>> [round(v, 3) for v in smooth([1.0, 0.0, 0.0], 0.5)]
    [1.0, 0.333, 0.143]
    """
    out, acc = [], 0.0
    for i, v in enumerate(values, 1):
        acc = weight * acc + (1 - weight) * v
        out.append(acc / (1 - weight ** i))
    return out


def x_range(last_step: int | None) -> list[int]:
    """[0, the smallest of 20, 25, 50, 100, 200, 250, 500, ... that holds the last step].

    >>> [x_range(s)[1] for s in (None, 3, 20, 21, 26, 101, 260, 1200)]
    [20, 20, 20, 25, 50, 200, 500, 2000]
    """
    need, scale = max(MIN_SPAN, last_step or 0), 10
    while True:
        for m in (2, 2.5, 5, 10):
            if m * scale >= need:
                return [0, int(m * scale)]
        scale *= 10


def lighter(color: str, amount: float = 0.55) -> str:
    """`color` mixed with white (the raw curve under its smoothed twin).

    >>> lighter("#000000", 0.5)
    '#808080'
    """
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


def shown_keys(title: str, rows: list[dict]) -> list[str]:
    """The metrics a run's panel draws: the panel's keys, less a run's only reward component when it is
    reward_mean itself (one reward function: the two lines would lie exactly on each other)."""
    keys = keys_of(PANELS[title], rows)
    parts = [k for k in keys if k.startswith("reward/")]
    if len(parts) == 1 and series_points(rows, parts[0]) == series_points(rows, "reward_mean"):
        keys.remove(parts[0])
    return keys


def keys_of(panel: tuple[str, ...], rows: list[dict]) -> list[str]:
    keys = []
    for k in panel:
        if k.endswith("/*"):
            prefix = k[:-1]
            keys += sorted({key for r in rows for key in r if key.startswith(prefix)})
        else:
            keys.append(k)
    return keys


def series_points(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of one metric; absent or null values are skipped.

    >>> series_points([{"step": 1, "entropy": 0.5}, {"step": 2, "entropy": None}, {"step": 3}], "entropy")
    [(1, 0.5)]
    """
    out = []
    for r in rows:
        v, step = num(r.get(key)), r.get("step")
        if v is not None and isinstance(step, int) and not isinstance(step, bool):
            out.append((step, v))
    return out


# --------------------------------------------------------------------------- one panel


@dataclass
class Entry:
    """One legend entry: its words, its colour, and how it is drawn (line, raw, smoothed, alarm, warning)."""

    label: str
    color: str
    kind: str = "line"


@dataclass
class Chart:
    """One panel: the frame to draw, a colour for every series in it, the legend, the step range."""

    points: list[dict] = field(default_factory=list)  # {step, value, series}
    colors: dict[str, str] = field(default_factory=dict)
    legend: list[Entry] = field(default_factory=list)
    x_lim: list[int] = field(default_factory=lambda: x_range(None))
    y_lim: list[float] | None = None  # only for a flat panel (every value the same), else the data decide
    title: str = ""  # the metric named above the legend (the Compare tab draws one metric per panel)

    @property
    def frame(self) -> pd.DataFrame:
        return frame(self.points)

    @property
    def empty(self) -> bool:
        return not self.points

    def style(self) -> dict:
        """What the page sends after the data: colours, step range, legend (JSON-ready)."""
        return {"colors": self.colors, "x_lim": self.x_lim, "y_lim": self.y_lim, "title": self.title,
                "legend": [asdict(e) for e in self.legend]}

    def finish(self) -> Chart:
        """The step range from the points; a y range around a flat panel's one value (else its axis has one
        tick, printed to six decimals)."""
        self.x_lim = x_range(max((p["step"] for p in self.points), default=None))
        values = [p["value"] for p in self.points]
        # flat to within rounding (an on-policy run's ESS is 1 - 1e-13): one value, a range around it
        if values and max(values) - min(values) <= 1e-6 * max(1.0, abs(max(values))):
            v = (max(values) + min(values)) / 2
            d = max(abs(v) * 0.1, 0.01)
            self.y_lim = [v - d, v + d]
        return self

    def add(self, series: str, pts: list[tuple[int, float]], color: str) -> None:
        self.points += [{"step": s, "value": v, "series": series} for s, v in pts]
        self.colors[series] = color

    def add_metric(self, series: str, pts: list[tuple[int, float]], color: str, noisy: bool) -> None:
        """The metric's curve, and for a noisy one its smoothed twin (raw drawn lighter beneath it)."""
        if not pts:
            return
        if not noisy:
            self.add(series, pts, color)
            self.legend.append(Entry(series, color))
            return
        self.add(series, pts, lighter(color))
        self.add(series + SMOOTHED, list(zip([s for s, _ in pts], smooth([v for _, v in pts]))), color)
        self.legend += [Entry(series, lighter(color), "raw"), Entry(series + SMOOTHED, color, "smoothed")]

    def add_alarms(self, alarms: list[dict], prefix: str = "") -> None:
        """A vertical mark at each alarm's step, across the values drawn so far; one legend entry per alarm name."""
        values = [p["value"] for p in self.points]
        if not values:
            return
        lo, hi = min(values), max(values)
        pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.05
        steps: dict[tuple[str, str], list[int]] = {}
        for a in alarms:
            kind = "warning" if a.get("severity") == "warning" else "alarm"
            name, step = str(a.get("name")), a.get("step")
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            series = f"{prefix}{kind}: {name} @ {step}"
            if series not in self.colors:
                self.add(series, [(step, lo - pad), (step, hi + pad)], MARK_COLORS[kind])
                steps.setdefault((kind, name), []).append(step)
        for (kind, name), at in steps.items():
            shown = ", ".join(map(str, at[:6])) + (", ..." if len(at) > 6 else "")
            self.legend.append(Entry(f"{prefix}{kind}: {name} (step{'s' if len(at) > 1 else ''} {shown})",
                                     MARK_COLORS[kind], kind))


def _alarms_for(title: str, alarms: list[dict]) -> list[dict]:
    return [a for a in alarms if title == "reward" or ALARM_PANELS.get(str(a.get("name"))) == title]


def run_chart(title: str, rows: list[dict], alarms: list[dict] = ()) -> Chart:
    """One run's panel: every metric of the panel (noisy ones with their smoothed twin), its alarms marked."""
    chart = Chart()
    for i, key in enumerate(shown_keys(title, rows)):
        chart.add_metric(key, series_points(rows, key), PALETTE[i % len(PALETTE)], key in NOISY)
    chart.add_alarms(_alarms_for(title, alarms))
    return chart.finish()


def short_names(names: list[str]) -> dict[str, str]:
    """Run names without the prefix they all share (up to a '-', '_' or '.'), so legends stay short.

    >>> short_names(["tiny-20261206-0714-ab", "tiny-20261206-0802-cd"])
    {'tiny-20261206-0714-ab': '…0714-ab', 'tiny-20261206-0802-cd': '…0802-cd'}
    >>> short_names(["a", "b"])
    {'a': 'a', 'b': 'b'}
    """
    if len(names) < 2:
        return {n: n for n in names}
    common = names[0]
    for n in names[1:]:
        while not n.startswith(common):
            common = common[:-1]
    cut = max(common.rfind(c) for c in "-_.") + 1
    return {n: ("…" + n[cut:] if cut >= 6 else n) for n in names}


def compare_chart(title: str, runs: dict[str, list[dict]], alarms: dict[str, list[dict]]) -> Chart:
    """Several runs on one panel: one metric of the panel for all (its first that varies, else its first
    measured), each run's alarms marked."""
    keys = [k for k in keys_of(PANELS[title], [r for rows in runs.values() for r in rows])
            if any(series_points(rows, k) for rows in runs.values())]
    varies = [k for k in keys if len({v for rows in runs.values() for _, v in series_points(rows, k)}) > 1]
    keys = varies + [k for k in keys if k not in varies]
    chart = Chart(title=keys[0] if keys else "")
    shown = short_names(list(runs))
    for i, (name, rows) in enumerate(runs.items()):
        if keys:
            chart.add_metric(shown[name], series_points(rows, keys[0]), PALETTE[i % len(PALETTE)], keys[0] in NOISY)
    for name in runs:
        chart.add_alarms(_alarms_for(title, alarms.get(name, [])), prefix=f"{shown[name]} · ")
    return chart.finish()


def charts(runs: dict[str, list[dict]], alarms: dict[str, list[dict]], compare: bool = False) -> dict[str, Chart]:
    """Panel title -> Chart: one run's panels, or (compare) every run on each panel."""
    if not compare and len(runs) == 1:
        (name, rows), = runs.items()
        return {t: run_chart(t, rows, alarms.get(name, [])) for t in PANELS}
    return {t: compare_chart(t, runs, alarms) for t in PANELS}


def legend_html(style: dict) -> str:
    """A panel's legend as HTML under its plot (it wraps, so every name shows): a swatch per entry in the
    colour its series is drawn in (a thin line for a raw curve, a thick one for its smoothed twin, a vertical
    bar for alarm and warning marks); `data-series` and `data-color` name what each entry stands for."""
    items = []
    for e in style.get("legend", []):
        label, color, kind = html.escape(e["label"]), html.escape(e["color"]), html.escape(e["kind"])
        items.append(f'<span class="entry {kind}" data-series="{label}" data-color="{color}" data-kind="{kind}">'
                     f'<span class="swatch" style="border-color:{color}"></span>{label}</span>')
    if not items:
        return '<div class="legend empty">no points yet</div>'
    title = f'<span class="metric">{html.escape(style["title"])}:</span>' if style.get("title") else ""
    return f'<div class="legend">{title}{"".join(items)}</div>'
