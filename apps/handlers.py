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

from tinyrl.apps import adapters, charts, evals, housekeeping, runs_table, runs_view
from tinyrl.apps import status as st
from tinyrl.apps.form_handlers import FormHandlers
from tinyrl.apps.launcher import Launcher, LaunchError
from tinyrl.apps.paths import UnsafePathError
from tinyrl.apps.tool_handlers import ToolHandlers
from tinyrl.config import ConfigError

CORE_PANELS = [t for t in charts.PANELS if t not in charts.OPTIONAL_PANELS]  # always shown; the others with data
VIEW_FIXED = ["status", "accuracy", "alarms_md", "alarms", "samples", "eval", "evals", "eval_ckpt", "log", "stop",
              "resume", "evaluate", "download", "clone", "archive", "delete"]
N_VIEW = len(VIEW_FIXED) + 2 * len(charts.PANELS)  # + each panel's plot and its box
N_CVIEW = 2 * len(charts.PANELS)


def user_errors(fn):
    """Refusals and bad input become a message on the page (and an error for API clients), not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UnsafePathError, LaunchError, ConfigError, FileNotFoundError, PermissionError) as e:
            raise gr.Error(args[0].shown(str(e)) if args and isinstance(args[0], App) else str(e),
                           print_exception=False) from None

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
        self.form = FormHandlers(self)
        self.tools = ToolHandlers(self)

    def shown(self, text: str) -> str:
        """`text` with the runs directory as the user named it and `python` for this interpreter."""
        text = text.replace(sys.executable, "python").replace(str(self.runs_dir), self.shown_dir)
        return text.replace(str(Path(self.shown_dir).absolute()), self.shown_dir)

    # ------------------------------------------------------------------ control

    @user_errors
    def stop(self, run):
        return self.launcher.stop(run or "")

    @user_errors
    def resume(self, run, overrides):
        return self.shown(self.launcher.resume(run or "", overrides or ""))

    @user_errors
    def evaluate(self, run, choice=None, samples=0, ks=(), prompts=None):
        """Evaluate the chosen adapter (latest, best, a checkpoint) with the options: samples per prompt and
        the k of pass@k / maj@k, the number of held-out prompts (empty: the run's data.num_eval)."""
        return self.launcher.evaluate(run or "", choice or adapters.LATEST, samples or 0, ks or (), prompts or None)

    @user_errors
    def download(self, run):
        return gr.File(str(self.launcher.adapter_zip(run or "")), visible=True)

    def ask_remove(self, run, what: str):
        """Archive / Delete asks first: (the confirmation row, its words, what is asked)."""
        if not run:
            return gr.skip(), gr.skip(), None
        if (kind := housekeeping.busy(self.runs_dir, run)) is not None:
            return gr.Row(visible=True), f"**{run}** cannot be {what}d: its {kind} process is running; stop it first", None
        words = {"archive": f"Archive **{run}**? Its folder moves to `{self.shown_dir}/{housekeeping.ARCHIVE}/` "
                            f"and leaves the runs list.",
                 "delete": f"Delete **{run}** for good? Its folder `{self.shown_dir}/{run}` and everything in it "
                           f"(checkpoints, adapter, exports) is removed."}[what]
        return gr.Row(visible=True), words, {"run": run, "what": what}

    def archive(self, run):
        return self.ask_remove(run, "archive")

    def delete(self, run):
        return self.ask_remove(run, "delete")

    def confirm_remove(self, asked):
        """The confirmed archive / delete: (action message, confirmation row, run dropdown)."""
        if not asked:
            return "", gr.Row(visible=False), gr.skip()
        try:
            msg = housekeeping.remove(self.runs_dir, asked["run"], archive=asked["what"] == "archive")
        except (UnsafePathError, FileNotFoundError, PermissionError, OSError) as e:
            return f"**not {asked['what']}d:** {self.shown(str(e))}", gr.Row(visible=False), gr.skip()
        names = runs_view.run_names(self.runs_dir)
        return msg, gr.Row(visible=False), gr.Dropdown(choices=names, value=names[0] if names else None)

    # ------------------------------------------------------------------ API reads

    def runs(self) -> list[dict]:
        """Every run in the runs directory: name, status, step, steps, reward, best reward, s/step, ETA,
        held-out result, started, description."""
        self.launcher.refresh()
        return [vars(r) for r in runs_table.list_runs(self.runs_dir)]

    @user_errors
    def run_info(self, run: str) -> dict:
        """One run: status, steps, checkpoints, adapter, alarms, summary, evaluation state."""
        self.launcher.refresh()
        self.launcher.run_path(run)
        return runs_table.info_dict(self.runs_dir, run)

    # ------------------------------------------------------------------ the Runs tab

    def _signature(self, runs: list[str]) -> list:
        """What the views of `runs` are made of: file sizes and times, run status, evaluation alive."""
        sig = []
        for run in runs:
            d = self.runs_dir / run
            files = [d / f for f in ("metrics.jsonl", "samples.jsonl", "alarms.jsonl", "summary.json", "resumes.jsonl",
                                     "evals", "adapter/adapter_model.safetensors")]
            files += [runs_view.ui_file(self.runs_dir, run, "train", "log"), *sorted((d / "evals").glob("*.log"))[-1:]]
            stats = [[f.stat().st_mtime_ns, f.stat().st_size] if f.exists() else None for f in files]
            ev = evals.status(self.runs_dir, run)["state"]
            ckpts = [c.name for c in runs_view.checkpoints(d)]
            sig.append([run, runs_view.status(self.runs_dir, run), ev, ckpts, housekeeping.busy(self.runs_dir, run),
                        stats])
        return sig

    def run_view(self, run: str, chosen: str | None = adapters.LATEST) -> tuple[list, dict, list[str]]:
        """The Runs tab's outputs for one run, its panels' styles, and (status, evaluation state); `chosen`: the
        adapter picked for Evaluate, kept while the run still holds it (else latest)."""
        path = self.launcher.run_path(run)
        info = runs_table.info(self.runs_dir, run)
        ckpts = [c.name for c in runs_view.checkpoints(path)]
        pid = (runs_view.process(self.runs_dir, run) or {}).get("pid")
        live = info.status in st.LIVE
        pace = (f"; {info.seconds_per_step:.2f} s/step" if info.seconds_per_step is not None else "") + \
            (f", ETA {st.duration(info.eta_s)}" if info.eta_s is not None else "")
        status = (f"**{run}**: {info.status}, step {info.step or 0}/{info.steps if info.steps is not None else '?'}"
                  f"{f', pid {pid}' if pid and live else ''}{pace}; checkpoints: {', '.join(ckpts) or 'none'}; "
                  f"{adapter_words(path)}")
        status += f"  \n{resumed}" if (resumed := runs_table.resume_text(path)) else ""
        status += f"  \n{links}" if (links := runs_view.tracker_text(path)) else ""  # log.report_to
        rows, alarms = runs_view.metrics(path), runs_view.alarms(path)
        panels = charts.charts({run: rows}, {run: alarms})
        headers, samples = runs_view.latest_samples(path)
        ev = evals.status(self.runs_dir, run)
        busy = housekeeping.busy(self.runs_dir, run)
        ctl = st.controls(info.status, ev["state"] == "running", bool(ckpts), runs_view.adapter_dir(path) is not None)
        alarm_rows = runs_view.alarm_rows(path)
        eval_rows = evals.table(evals.records(self.runs_dir, run))
        view = {
            "status": status, "accuracy": runs_table.accuracy_text(self.runs_dir, run),
            "alarms_md": alarms_words(alarms, len(rows)),
            "alarms": gr.Dataframe(pd.DataFrame(alarm_rows, columns=runs_view.ALARM_HEADERS), visible=bool(alarm_rows)),
            "samples": pd.DataFrame(samples, columns=headers), "eval": st.eval_line(ev),
            "evals": gr.Dataframe(pd.DataFrame(eval_rows, columns=evals.HEADERS), visible=bool(eval_rows)),
            "eval_ckpt": gr.Dropdown(choices=(choices := adapters.choices(path)),
                                     value=chosen if chosen in [v for _, v in choices] else
                                     adapters.LATEST if choices else None),
            "log": self.shown(runs_view.log_tail(runs_view.ui_file(self.runs_dir, run, "train", "log"))),
            "stop": gr.Button(interactive=ctl.stop), "resume": gr.Button(interactive=ctl.resume),
            "evaluate": gr.Button(interactive=ctl.evaluate), "download": gr.Button(interactive=ctl.download),
            "clone": gr.Button(interactive=path.is_dir()), "archive": gr.Button(interactive=path.is_dir() and not busy),
            "delete": gr.Button(interactive=path.is_dir() and not busy),
        }
        outputs = [view[k] for k in VIEW_FIXED] + plot_updates(panels)
        return outputs, {t: c.style() for t, c in panels.items()}, [info.status, ev["state"]]

    def selected(self, run, seen):
        """A run chosen in the dropdown: its view now (and no message left from another run's action)."""
        seen = dict(seen or {})
        if not run:
            return [gr.skip()] * N_VIEW + [gr.skip(), seen, gr.skip(), gr.skip(), gr.skip(), gr.skip()]
        try:
            view, styles, procs = self.run_view(run)
        except (UnsafePathError, LaunchError) as e:
            raise gr.Error(str(e), print_exception=False) from None
        seen.update(sig=self._signature([run]), procs=procs)
        # another run's adapter zip and pending confirmation go with the run they belonged to
        return view + ["", seen, styles, gr.File(value=None, visible=False), gr.Row(visible=False), None]

    def first_run(self) -> str | None:
        """The run to show when the page opens: the newest live one, else the newest."""
        infos = runs_table.list_runs(self.runs_dir)
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

    def tick(self, run, compared, seen, chosen=None):
        """Timer: the runs table and run choices when they change; the selected run's view and the compared
        runs' curves when their files change; the action message goes when the process it answered ends."""
        seen = dict(seen or {})
        self.launcher.refresh()
        infos = runs_table.list_runs(self.runs_dir)
        table, names = [i.row() for i in infos], [i.name for i in infos]
        out_table = gr.skip() if table == seen.get("table") else pd.DataFrame(table, columns=runs_table.TABLE_HEADERS)
        out_choices = gr.skip() if names == seen.get("names") else gr.Dropdown(choices=names)
        out_compare = gr.skip() if names == seen.get("names") else gr.Dropdown(choices=names)
        seen.update(table=table, names=names)
        view, action, run_styles, cmp_styles = [gr.skip()] * N_VIEW, gr.skip(), gr.skip(), gr.skip()
        if run:
            try:
                sig = self._signature([run])
                if sig != seen.get("sig"):
                    view, run_styles, procs = self.run_view(run, chosen)
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


def adapter_words(run: Path) -> str:
    """Which adapter the run has, in the words of what Evaluate / Download / Chat use.

    >>> import tempfile, pathlib; adapter_words(pathlib.Path(tempfile.mkdtemp()))
    'adapter: none yet (the first checkpoint saves one)'
    """
    found = runs_view.adapter_dir(run)
    if found is None:
        return "adapter: none yet (the first checkpoint saves one)"
    if found == run / "adapter":
        return "adapter: final (adapter/)"
    return (f"adapter: no final one yet; Evaluate, Download and Chat use checkpoint step "
            f"{adapters.step_of(found.parent.name)}'s")


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
