"""The gradio page: Launch (preset, profile, key fields, overrides, live validation, the memory
planner's verdict on a chosen card, Start),
Runs (table, live curves, alarms, samples, accuracy, log; Stop / Resume / Evaluate / adapter zip)
and Compare (several runs on the same axes).

Every handler is a thin call into forms / launcher / runs_view; a 2-second timer re-reads the
run folders and sends only what changed. Named API endpoints (`/validate`, `/memory`, `/start`, `/stop`,
`/resume`, `/evaluate`, `/download`, `/runs`, `/run_info`) make the same actions scriptable
with gradio_client.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gradio as gr
import pandas as pd

from tinyrl.apps import forms, runs_view
from tinyrl.apps.launcher import Launcher, LaunchError
from tinyrl.apps.paths import UnsafePathError, check_name
from tinyrl.config import DEFAULT_PRESET, ConfigError

REFRESH_S = 2.0
CORE_PANELS = [t for t in runs_view.PANELS if t != "agent"]  # always shown; "agent" only with data
CSS = """
#plots .block, #compare-plots .block { min-width: 300px; }
"""


def launch_kwargs() -> dict:
    """Blocks.launch arguments that belong to this app (gradio 6 takes theme and css at launch)."""
    return {"theme": gr.themes.Default(), "css": CSS, "ssr_mode": False, "show_error": True}


def _user_errors(fn):
    """Refusals and bad input become a message on the page (and an error for API clients), not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UnsafePathError, LaunchError, ConfigError, FileNotFoundError) as e:
            raise gr.Error(str(e), print_exception=False) from None

    return wrapper


def _slug(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def _frame(points: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(points, columns=["step", "value", "series"])


def _plots(title_prefix: str, elem_prefix: str) -> dict[str, gr.LinePlot]:
    out = {}
    with gr.Row(equal_height=True):
        for title in runs_view.PANELS:
            out[title] = gr.LinePlot(_frame([]), x="step", y="value", color="series", label=f"{title_prefix}{title}",
                                     elem_id=f"{elem_prefix}{_slug(title)}", height=290, x_title="step", y_title=title,
                                     visible=title != "agent", min_width=300)
    return out


def _plot_updates(curves: dict[str, list[dict]]) -> list:
    return [gr.LinePlot(value=_frame(pts), visible=bool(pts) or title in CORE_PANELS) for title, pts in curves.items()]


class App:
    """The handlers, bound to one runs directory (state lives in the run folders, not here)."""

    def __init__(self, runs_dir: Path):
        self.launcher = Launcher(runs_dir)
        self.runs_dir = self.launcher.runs_dir

    # ------------------------------------------------------------------ launch

    def preset_changed(self, preset: str):
        forms.check_preset(preset)
        header = f"```text\n{forms.preset_header(preset)}\n```"
        return (header, gr.Dropdown(choices=[""] + forms.profiles(preset), value=""), *self.form_for(preset, ""))

    def form_for(self, preset: str, profile: str):
        values = forms.form_values(preset, profile or None)
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

    @_user_errors
    def start(self, preset, profile, *rest):
        *values, name, free = rest
        forms.check_preset(preset)
        plan = forms.validate(preset, profile, dict(zip(forms.KEYS, values)), free)
        run = self.launcher.start(plan, name.strip() or None)
        msg = f"started **{run}**: `{plan.shown()}` (log: `{self.runs_dir}/{runs_view.UI_DIR}/{run}.train.log` until its folder exists)"
        return msg, gr.Dropdown(choices=runs_view.run_names(self.runs_dir), value=run), gr.Tabs(selected="runs")

    # ------------------------------------------------------------------ control

    @_user_errors
    def stop(self, run):
        return self.launcher.stop(run or "")

    @_user_errors
    def resume(self, run, overrides):
        return self.launcher.resume(run or "", overrides or "")

    @_user_errors
    def evaluate(self, run):
        return self.launcher.evaluate(run or "")

    @_user_errors
    def download(self, run):
        return gr.File(str(self.launcher.adapter_zip(run or "")), visible=True)

    # ------------------------------------------------------------------ watch

    def runs(self) -> list[dict]:
        """Every run in the runs directory: name, status, step, steps, reward, started, description."""
        self.launcher.refresh()
        return [vars(r) for r in runs_view.list_runs(self.runs_dir)]

    @_user_errors
    def run_info(self, run: str) -> dict:
        """One run: status, steps, checkpoints, adapter, alarms, summary, evaluation state."""
        self.launcher.refresh()
        self.launcher.run_path(run)
        return runs_view.info_dict(self.runs_dir, run)

    def _signature(self, run: str) -> tuple:
        d = self.runs_dir / run
        files = [d / f for f in ("metrics.jsonl", "samples.jsonl", "alarms.jsonl", "summary.json", "eval.log")]
        files.append(runs_view.ui_file(self.runs_dir, run, "train", "log"))
        stats = tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.exists() else None for f in files)
        return run, runs_view.status(self.runs_dir, run), stats

    def run_view(self, run: str) -> list:
        """The Runs tab's outputs for one run (status, accuracy, curves, alarms, samples, eval, log)."""
        path = self.launcher.run_path(run)
        info = runs_view.info(self.runs_dir, run)
        ckpts = [c.name for c in runs_view.checkpoints(path)]
        pid = (runs_view.process(self.runs_dir, run) or {}).get("pid")
        status = (f"**{run}**: {info.status}, step {info.step or 0}/{info.steps if info.steps is not None else '?'}"
                  f"{f', pid {pid}' if pid and info.status in ('running', 'starting') else ''}; "
                  f"checkpoints: {', '.join(ckpts) or 'none'}; adapter: {'yes' if (path / 'adapter').is_dir() else 'no'}")
        headers, rows = runs_view.latest_samples(path)
        ev = runs_view.eval_status(self.runs_dir, run)
        eval_md = {"none": "no evaluation yet", "running": "evaluation running ..."}.get(ev["state"], ev["result"] or "evaluation ended; see eval.log")
        return [status, runs_view.accuracy_text(path), *_plot_updates(runs_view.curves(self.runs_dir, [run])),
                pd.DataFrame(runs_view.alarm_rows(path), columns=runs_view.ALARM_HEADERS),
                pd.DataFrame(rows, columns=headers), eval_md,
                runs_view.log_tail(runs_view.ui_file(self.runs_dir, run, "train", "log"))]

    def tick(self, run, seen: dict):
        """Timer: the runs table and run choices when they change; the selected run's view when its files change."""
        seen = dict(seen or {})
        self.launcher.refresh()
        infos = runs_view.list_runs(self.runs_dir)
        table = [i.row() for i in infos]
        names = [i.name for i in infos]
        out_table = gr.skip() if table == seen.get("table") else pd.DataFrame(table, columns=runs_view.TABLE_HEADERS)
        out_choices = gr.skip() if names == seen.get("names") else gr.Dropdown(choices=names)
        out_compare = gr.skip() if names == seen.get("names") else gr.Dropdown(choices=names)
        seen.update(table=table, names=names)
        view = [gr.skip()] * N_VIEW
        if run:
            try:
                sig = self._signature(run)
                if list(sig) != seen.get("sig"):
                    view, seen["sig"] = self.run_view(run), list(sig)
            except (UnsafePathError, LaunchError):
                pass
        return [out_table, out_choices, out_compare, *view, seen]

    def selected(self, run):
        if not run:
            return [gr.skip()] * N_VIEW
        try:
            return self.run_view(run)
        except (UnsafePathError, LaunchError) as e:
            raise gr.Error(str(e), print_exception=False) from None

    def first_run(self) -> str | None:
        """The run to show when the page opens: the newest live one, else the newest."""
        infos = runs_view.list_runs(self.runs_dir)
        live = [i.name for i in infos if i.status in ("running", "starting")]
        return (live or [i.name for i in infos] or [None])[0]

    def compare(self, runs):
        names = [r for r in (runs or []) if r]
        for r in names:
            self.launcher.run_path(r)
        return _plot_updates(runs_view.curves(self.runs_dir, names))


N_VIEW = 2 + len(runs_view.PANELS) + 4  # status, accuracy, plots, alarms, samples, eval, log


def build_app(runs_dir: Path) -> gr.Blocks:
    app = App(runs_dir)
    presets = forms.presets()
    default = DEFAULT_PRESET if DEFAULT_PRESET in presets else presets[0]
    with gr.Blocks(title="tinyrl", analytics_enabled=False) as demo:
        gr.Markdown(f"## tinyrl\nRuns in `{app.runs_dir}`. Training runs as its own process: closing this page "
                    f"(or the UI) never stops it; reopening re-attaches.")
        with gr.Tabs(selected="launch") as tabs:
            with gr.Tab("Launch", id="launch"):
                with gr.Row():
                    preset = gr.Dropdown(presets, value=default, label="preset", elem_id="preset")
                    profile = gr.Dropdown([""] + forms.profiles(default), value="", label="profile (hardware)",
                                          elem_id="profile")
                    card = gr.Dropdown(forms.card_choices(), value=forms.DETECTED, label="card (for the memory plan)",
                                       elem_id="card")
                header = gr.Markdown(f"```text\n{forms.preset_header(default)}\n```", elem_id="preset-header")
                fields = _form(default)
                with gr.Row():
                    run_name = gr.Textbox(label="run name (optional; default: preset + time)", elem_id="run-name")
                    free = gr.Textbox(label="more overrides (section.field=value, space or newline separated)",
                                      lines=2, placeholder="algo.beta=0.04 train.save_every=10", elem_id="overrides")
                validation = gr.Markdown(elem_id="validation")
                command = gr.Code(language="shell", label="the command the UI runs", elem_id="command", interactive=False)
                memory = gr.Markdown(elem_id="memory")
                with gr.Accordion("memory plan: every component", open=False, elem_id="memory-table-box"):
                    memory_table = gr.Markdown(elem_id="memory-table")
                start = gr.Button("Start", variant="primary", elem_id="start-btn")
                start_msg = gr.Markdown(elem_id="start-msg")
            with gr.Tab("Runs", id="runs"):
                runs_table = gr.Dataframe(headers=runs_view.TABLE_HEADERS, interactive=False, elem_id="runs-table",
                                          max_height=260)
                with gr.Row():
                    run = gr.Dropdown([], allow_custom_value=True, label="run", elem_id="run-select", scale=3)
                    stop = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    resume = gr.Button("Resume", elem_id="resume-btn")
                    evaluate = gr.Button("Evaluate adapter", elem_id="eval-btn")
                    download = gr.Button("Download adapter", elem_id="download-btn")
                resume_over = gr.Textbox(label="resume overrides (optional, e.g. train.steps=200 to train longer)",
                                         elem_id="resume-overrides")
                action_msg = gr.Markdown(elem_id="action-msg")
                adapter_file = gr.File(label="adapter (zip)", elem_id="adapter-file", interactive=False, visible=False)
                run_status = gr.Markdown(elem_id="run-status")
                accuracy = gr.Markdown(elem_id="accuracy")
                with gr.Column(elem_id="plots"):
                    plots = _plots("", "plot-")
                alarms_df = gr.Dataframe(headers=runs_view.ALARM_HEADERS, label="alarms (evidence and suggested fix)",
                                         interactive=False, wrap=True, elem_id="alarms",
                                         column_widths=["6%", "14%", "35%", "35%", "10%"])
                samples_df = gr.Dataframe(label="latest samples (per-component rewards)", interactive=False, wrap=True,
                                          elem_id="samples")
                eval_md = gr.Markdown(elem_id="eval-result")
                log = gr.Textbox(label="log (tail)", lines=14, max_lines=14, interactive=False, autoscroll=True,
                                 elem_id="log-tail")
            with gr.Tab("Compare", id="compare"):
                compare = gr.Dropdown([], multiselect=True, allow_custom_value=True, label="runs to compare",
                                      elem_id="compare-select")
                with gr.Column(elem_id="compare-plots"):
                    cplots = _plots("", "cmp-")
        seen = gr.State({})
        timer = gr.Timer(REFRESH_S)

        form_inputs = [preset, profile, *fields, run_name, free]
        view = [run_status, accuracy, *plots.values(), alarms_df, samples_df, eval_md, log]
        preset.change(app.preset_changed, preset, [header, profile, *fields], api_visibility="private")
        profile.change(app.form_for, [preset, profile], fields, api_visibility="private")
        profile.change(app.profile_card, profile, card, api_visibility="private")
        gr.on([c.change for c in form_inputs], app.validate, form_inputs, [validation, command],
              trigger_mode="always_last", api_name="validate")
        gr.on([c.change for c in [*form_inputs, card]], app.memory, [*form_inputs, card], [memory, memory_table],
              trigger_mode="always_last", api_name="memory")
        start.click(app.start, form_inputs, [start_msg, run, tabs], api_name="start")
        stop.click(app.stop, run, action_msg, api_name="stop")
        resume.click(app.resume, [run, resume_over], action_msg, api_name="resume")
        evaluate.click(app.evaluate, run, action_msg, api_name="evaluate")
        download.click(app.download, run, adapter_file, api_name="download")
        run.change(app.selected, run, view, api_visibility="private")
        runs_table.select(_row_name, runs_table, run, api_visibility="private")
        compare.change(app.compare, compare, list(cplots.values()), api_name="compare")
        timer.tick(app.tick, [run, seen], [runs_table, run, compare, *view, seen], api_visibility="private",
                   show_progress="hidden")
        demo.load(lambda: gr.Dropdown(choices=runs_view.run_names(app.runs_dir), value=app.first_run()), None, run,
                  api_visibility="private")
        demo.load(app.validate, form_inputs, [validation, command], api_visibility="private")
        demo.load(app.memory, [*form_inputs, card], [memory, memory_table], api_visibility="private")
        gr.api(app.runs, api_name="runs")
        gr.api(app.run_info, api_name="run_info")
    return demo


def _form(preset: str) -> list:
    """The key fields, filled with the preset's values (order: forms.FIELDS)."""
    from tinyrl.algo.recipes import RECIPES
    from tinyrl.tasks import TASKS

    v = forms.form_values(preset, None)
    labels = dict((k, label) for label, k in forms.FIELDS)
    with gr.Row():
        model = gr.Textbox(v["model.name"], label=labels["model.name"], elem_id="f-model")
        task = gr.Dropdown(sorted(TASKS) + ["jsonl"], value=v["data.task"], label=labels["data.task"],
                           allow_custom_value=True, elem_id="f-task")
        recipe = gr.Dropdown([forms.NO_RECIPE, *RECIPES], value=v["algo.recipe"] or forms.NO_RECIPE,
                             label=labels["algo.recipe"], allow_custom_value=True, elem_id="f-recipe")
        four_bit = gr.Checkbox(v["model.load_in_4bit"], label=labels["model.load_in_4bit"], elem_id="f-4bit")
    with gr.Row():
        steps = gr.Number(v["train.steps"], label=labels["train.steps"], precision=0, elem_id="f-steps")
        lr = gr.Number(v["train.lr"], label=labels["train.lr"], elem_id="f-lr")
        group = gr.Number(v["rollout.num_generations"], label=labels["rollout.num_generations"], precision=0,
                          elem_id="f-group")
        prompts = gr.Number(v["train.prompts_per_step"], label=labels["train.prompts_per_step"], precision=0,
                            elem_id="f-prompts")
        lora_r = gr.Number(v["lora.r"], label=labels["lora.r"], precision=0, elem_id="f-lora-r")
        max_new = gr.Number(v["rollout.max_new_tokens"], label=labels["rollout.max_new_tokens"], precision=0,
                            elem_id="f-max-new")
    by_key = {"model.name": model, "data.task": task, "train.steps": steps, "train.lr": lr,
              "rollout.num_generations": group, "train.prompts_per_step": prompts, "algo.recipe": recipe,
              "lora.r": lora_r, "model.load_in_4bit": four_bit, "rollout.max_new_tokens": max_new}
    return [by_key[k] for k in forms.KEYS]


def _row_name(table, evt: gr.SelectData):
    try:
        return table.iloc[evt.index[0], 0]
    except (IndexError, KeyError, TypeError, AttributeError):
        return gr.skip()
