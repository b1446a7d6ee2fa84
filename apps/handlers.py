"""The page's handlers (`App`), bound to one runs directory; ui.py lays out the page and wires them.

Every handler is a thin call into forms / launcher / runs_view / charts / status; the state
lives in the run folders. What the page last received is kept per browser tab in a `seen` dict
(a gr.State): the timer sends only what changed since.

The curves go in two steps (see charts.py): the data first, with each panel's style (colours,
step range, legend) in a hidden JSON component beside it, then, in a `.then`, `restyle` applies the
styles that component holds, so a chart is rebuilt only with its data already in place. The styles
travel with the data they belong to, not through `seen`, which events that overlap may overwrite;
and as a style sent again unchanged rebuilds nothing, `restyle` sends them all after every tick,
so a late or lost one is repaired within one tick.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import gradio as gr
import pandas as pd

from tinyrl.apps import charts, forms, runs_view
from tinyrl.apps import status as st
from tinyrl.apps.launcher import Launcher, LaunchError
from tinyrl.apps.paths import UnsafePathError, check_name
from tinyrl.config import ConfigError

CORE_PANELS = [t for t in charts.PANELS if t not in charts.OPTIONAL_PANELS]  # always shown; the others with data
VIEW_FIXED = ["status", "accuracy", "alarms_md", "alarms", "samples", "eval", "log", "stop", "resume", "evaluate",
              "download"]
N_VIEW = len(VIEW_FIXED) + 2 * len(charts.PANELS)  # + each panel's plot and its box
N_CVIEW = 2 * len(charts.PANELS)


def user_errors(fn):
    """Refusals and bad input become a message on the page (and an error for API clients), not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UnsafePathError, LaunchError, ConfigError, FileNotFoundError) as e:
            raise gr.Error(str(e), print_exception=False) from None

    return wrapper


def plot_updates(panels: dict[str, charts.Chart]) -> list:
    """Each panel's data (typed frame), then each panel box shown when it has data or is a core panel."""
    return ([gr.LinePlot(value=c.frame) for c in panels.values()]
            + [gr.Column(visible=not c.empty or t in CORE_PANELS) for t, c in panels.items()])


class App:
    """The handlers, bound to one runs directory (state lives in the run folders, not here)."""

    def __init__(self, runs_dir: Path):
        self.shown_dir = str(runs_dir)  # as the user gave it: the page shows paths in these words
        self.launcher = Launcher(runs_dir)
        self.runs_dir = self.launcher.runs_dir

    def shown(self, text: str) -> str:
        """`text` with the runs directory as the user named it and `python` for this interpreter."""
        return text.replace(sys.executable, "python").replace(str(self.runs_dir), self.shown_dir)

    # ------------------------------------------------------------------ launch

    def preset_changed(self, preset: str):
        """The preset's header, profiles and field values; a name that is not a shipped preset gets the error."""
        try:
            forms.check_preset(preset)
        except ConfigError as e:
            return (f"**tinyrl: error:** `{e}`", gr.skip(), *[gr.skip()] * len(forms.KEYS))
        header = f"```text\n{forms.preset_header(preset)}\n```"
        return (header, gr.Dropdown(choices=[""] + forms.profiles(preset), value=""), *self.form_for(preset, ""))

    def form_for(self, preset: str, profile: str):
        try:
            values = forms.form_values(preset, profile or None)
        except ConfigError:
            return [gr.skip()] * len(forms.KEYS)  # the validation line says why
        return [forms.NO_RECIPE if k == "algo.recipe" and v is None else v for k, v in values.items()]

    def validate(self, preset, profile, *rest):
        """(validation message, command line) for the form as it stands."""
        *values, name, free = rest
        try:
            forms.check_preset(preset)
            plan = forms.validate(preset, profile, dict(zip(forms.KEYS, values)), free)
            if name:
                check_name(name)
        except (ConfigError, UnsafePathError) as e:
            return f"**tinyrl: error:** `{e}`", ""
        return f"valid: {forms.summary(plan.config)}", plan.shown()

    def memory(self, preset, profile, *rest):
        """(verdict, the whole plan) of the memory planner for the form as it stands on the chosen card."""
        *values, _name, free, card = rest
        try:
            forms.check_preset(preset)
            plan = forms.validate(preset, profile, dict(zip(forms.KEYS, values)), free)
        except ConfigError:
            return "**memory plan:** none until the form is valid (see above)", ""
        est = forms.memory_estimate(plan.config, card, profile or None)
        return f"**memory plan** (`tinyrl plan`)\n```text\n{est.summary}\n```", \
            f"```text\n{est.table}\n```" if est.table else ""

    def profile_card(self, profile):
        """A profile that names a card (24gb -> L4) chooses it for the memory plan; others leave the card."""
        return forms.card_for_profile(profile) or gr.skip()

    @user_errors
    def start(self, preset, profile, *rest):
        *values, name, free = rest
        forms.check_preset(preset)
        plan = forms.validate(preset, profile, dict(zip(forms.KEYS, values)), free)
        run = self.launcher.start(plan, name.strip() or None)
        log = self.shown(str(runs_view.staging_file(self.runs_dir, run, "train", "log")))
        msg = f"started **{run}**: `{plan.shown()}` (log: `{log}` until its folder exists)"
        return msg, gr.Dropdown(choices=runs_view.run_names(self.runs_dir), value=run), gr.Tabs(selected="runs")

    # ------------------------------------------------------------------ control

    @user_errors
    def stop(self, run):
        return self.launcher.stop(run or "")

    @user_errors
    def resume(self, run, overrides):
        return self.launcher.resume(run or "", overrides or "")

    @user_errors
    def evaluate(self, run):
        return self.launcher.evaluate(run or "")

    @user_errors
    def download(self, run):
        return gr.File(str(self.launcher.adapter_zip(run or "")), visible=True)

    # ------------------------------------------------------------------ API reads

    def runs(self) -> list[dict]:
        """Every run in the runs directory: name, status, step, steps, reward, best reward, s/step, ETA,
        held-out result, started, description."""
        self.launcher.refresh()
        return [vars(r) for r in runs_view.list_runs(self.runs_dir)]

    @user_errors
    def run_info(self, run: str) -> dict:
        """One run: status, steps, checkpoints, adapter, alarms, summary, evaluation state."""
        self.launcher.refresh()
        self.launcher.run_path(run)
        return runs_view.info_dict(self.runs_dir, run)

    # ------------------------------------------------------------------ the Runs tab

    def _signature(self, runs: list[str]) -> list:
        """What the views of `runs` are made of: file sizes and times, run status, evaluation alive."""
        sig = []
        for run in runs:
            d = self.runs_dir / run
            files = [d / f for f in ("metrics.jsonl", "samples.jsonl", "alarms.jsonl", "summary.json", "eval.log")]
            files.append(runs_view.ui_file(self.runs_dir, run, "train", "log"))
            stats = [[f.stat().st_mtime_ns, f.stat().st_size] if f.exists() else None for f in files]
            ev = runs_view.eval_status(self.runs_dir, run)["state"]
            sig.append([run, runs_view.status(self.runs_dir, run), ev, len(runs_view.checkpoints(d)), stats])
        return sig

    def run_view(self, run: str) -> tuple[list, dict, list[str]]:
        """The Runs tab's outputs for one run, its panels' styles, and (status, evaluation state)."""
        path = self.launcher.run_path(run)
        info = runs_view.info(self.runs_dir, run)
        ckpts = [c.name for c in runs_view.checkpoints(path)]
        pid = (runs_view.process(self.runs_dir, run) or {}).get("pid")
        live = info.status in st.LIVE
        pace = (f"; {info.seconds_per_step:.2f} s/step" if info.seconds_per_step is not None else "") + \
            (f", ETA {st.duration(info.eta_s)}" if info.eta_s is not None else "")
        status = (f"**{run}**: {info.status}, step {info.step or 0}/{info.steps if info.steps is not None else '?'}"
                  f"{f', pid {pid}' if pid and live else ''}{pace}; checkpoints: {', '.join(ckpts) or 'none'}; "
                  f"adapter: {'yes' if (path / 'adapter').is_dir() else 'no'}")
        status += f"  \n{links}" if (links := runs_view.tracker_text(path)) else ""  # log.report_to
        rows, alarms = runs_view.metrics(path), runs_view.alarms(path)
        panels = charts.charts({run: rows}, {run: alarms})
        headers, samples = runs_view.latest_samples(path)
        ev = runs_view.eval_status(self.runs_dir, run)
        ctl = st.controls(info.status, ev["state"] == "running", bool(ckpts), runs_view.adapter_dir(path) is not None)
        alarm_rows = runs_view.alarm_rows(path)
        view = {
            "status": status, "accuracy": runs_view.accuracy_text(path),
            "alarms_md": alarms_words(alarms, len(rows)),
            "alarms": gr.Dataframe(pd.DataFrame(alarm_rows, columns=runs_view.ALARM_HEADERS), visible=bool(alarm_rows)),
            "samples": pd.DataFrame(samples, columns=headers), "eval": st.eval_line(ev),
            "log": self.shown(runs_view.log_tail(runs_view.ui_file(self.runs_dir, run, "train", "log"))),
            "stop": gr.Button(interactive=ctl.stop), "resume": gr.Button(interactive=ctl.resume),
            "evaluate": gr.Button(interactive=ctl.evaluate), "download": gr.Button(interactive=ctl.download),
        }
        outputs = [view[k] for k in VIEW_FIXED] + plot_updates(panels)
        return outputs, {t: c.style() for t, c in panels.items()}, [info.status, ev["state"]]

    def selected(self, run, seen):
        """A run chosen in the dropdown: its view now (and no message left from another run's action)."""
        seen = dict(seen or {})
        if not run:
            return [gr.skip()] * N_VIEW + [gr.skip(), seen, gr.skip()]
        try:
            view, styles, procs = self.run_view(run)
        except (UnsafePathError, LaunchError) as e:
            raise gr.Error(str(e), print_exception=False) from None
        seen.update(sig=self._signature([run]), procs=procs)
        return view + ["", seen, styles]

    def first_run(self) -> str | None:
        """The run to show when the page opens: the newest live one, else the newest."""
        infos = runs_view.list_runs(self.runs_dir)
        live = [i.name for i in infos if i.status in st.LIVE]
        return (live or [i.name for i in infos] or [None])[0]

    # ------------------------------------------------------------------ the Compare tab

    def compare_view(self, names: list[str]) -> tuple[list, dict]:
        for r in names:
            self.launcher.run_path(r)
        runs = {r: runs_view.metrics(self.runs_dir / r) for r in names}
        panels = charts.charts(runs, {r: runs_view.alarms(self.runs_dir / r) for r in names}, compare=True)
        return plot_updates(panels), {t: c.style() for t, c in panels.items()}

    @user_errors
    def compare(self, runs, seen=None):
        """Several runs on the same axes (the API returns the plots' data)."""
        seen = dict(seen or {})
        names = [r for r in (runs or []) if r]
        view, styles = self.compare_view(names)
        seen["csig"] = [names, self._signature(names)]
        return view + [seen, styles]

    # ------------------------------------------------------------------ the timer

    def tick(self, run, compared, seen):
        """Timer: the runs table and run choices when they change; the selected run's view and the compared
        runs' curves when their files change; the action message goes when the process it answered ends."""
        seen = dict(seen or {})
        self.launcher.refresh()
        infos = runs_view.list_runs(self.runs_dir)
        table, names = [i.row() for i in infos], [i.name for i in infos]
        out_table = gr.skip() if table == seen.get("table") else pd.DataFrame(table, columns=runs_view.TABLE_HEADERS)
        out_choices = gr.skip() if names == seen.get("names") else gr.Dropdown(choices=names)
        out_compare = gr.skip() if names == seen.get("names") else gr.Dropdown(choices=names)
        seen.update(table=table, names=names)
        view, action, run_styles, cmp_styles = [gr.skip()] * N_VIEW, gr.skip(), gr.skip(), gr.skip()
        if run:
            try:
                sig = self._signature([run])
                if sig != seen.get("sig"):
                    view, run_styles, procs = self.run_view(run)
                    if st.ended(tuple(seen["procs"]) if seen.get("procs") else None, tuple(procs)):
                        action = ""
                    seen.update(sig=sig, procs=procs)
            except (UnsafePathError, LaunchError):
                pass
        cview = [gr.skip()] * N_CVIEW
        names_cmp = [r for r in (compared or []) if r]
        if names_cmp:
            try:
                csig = [names_cmp, self._signature(names_cmp)]
                if csig != seen.get("csig"):
                    cview, cmp_styles = self.compare_view(names_cmp)
                    seen["csig"] = csig
            except (UnsafePathError, LaunchError):
                pass
        return [out_table, out_choices, out_compare, *view, action, *cview, seen, run_styles, cmp_styles]

    def restyle(self, run_styles, cmp_styles):
        """After the data: every panel's colours, step range and legend, from the styles sent with that data."""
        out_plots, out_legends = [], []
        for styles in (run_styles, cmp_styles):
            for title in charts.PANELS:
                style = (styles or {}).get(title)
                out_plots.append(gr.skip() if style is None else gr.LinePlot(
                    color_map=style["colors"] or None, x_lim=style["x_lim"], y_lim=style["y_lim"]))
                out_legends.append(gr.skip() if style is None else charts.legend_html(style))
        return out_plots + out_legends


def alarms_words(alarms: list[dict], steps: int) -> str:
    """The line above the alarms table; with no alarm it says so (and the empty table is hidden).

    >>> alarms_words([], 12)
    '**no alarms**: the monitor checked 12 steps and flagged nothing'
    """
    if alarms:
        n_warn = sum(1 for a in alarms if a.get("severity") == "warning")
        return (f"**{len(alarms)} alarm{'s' if len(alarms) != 1 else ''}** from the monitor"
                f"{f' ({n_warn} of them warnings)' if n_warn else ''}, marked on the curves (red: alarm, "
                f"orange: warning); evidence and the suggested fix below")
    if steps:
        return f"**no alarms**: the monitor checked {steps} step{'s' if steps != 1 else ''} and flagged nothing"
    return "**no alarms**: the monitor checks every step once training is under way"
