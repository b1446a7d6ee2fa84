"""The gradio page: Launch (preset, profile, key fields, overrides, live validation, the memory
planner's verdict on a chosen card, Start),
Runs (table with s/step, ETA, best reward and held-out result; live curves with smoothed twins and
alarm marks; alarms, samples, accuracy, evaluation, log; Stop / Resume / Evaluate / adapter zip,
each enabled by the run's state) and Compare (several runs on the same axes, live).

This module lays the page out and wires events to the handlers (handlers.py); a 2-second timer
re-reads the run folders and sends only what changed. Named API endpoints (`/validate`, `/memory`,
`/start`, `/stop`, `/resume`, `/evaluate`, `/download`, `/runs`, `/run_info`, `/compare`) make the
same actions scriptable with gradio_client.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from tinyrl.apps import charts, forms, runs_view
from tinyrl.apps.handlers import VIEW_FIXED, App
from tinyrl.config import DEFAULT_PRESET

REFRESH_S = 2.0
# Panels in a grid of equal columns at most ~800 px wide: the step axis then has at most ~20 ticks,
# each on a whole step (charts.MIN_SPAN). The legend is HTML under each plot, so it wraps.
CSS = """
#plots, #compare-plots { display: grid !important; grid-template-columns: repeat(auto-fill, minmax(400px, 1fr));
  gap: 12px; }
[id^="plot-box-"], [id^="cmp-box-"] { min-width: 0 !important; gap: 2px !important; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 14px; padding: 2px 8px 6px; font-size: 12px; line-height: 18px; }
.legend .metric { font-weight: 600; }
.legend .entry { display: inline-flex; align-items: center; white-space: nowrap; }
.legend .swatch { display: inline-block; width: 18px; margin-right: 5px; border-top: 3px solid; }
.legend .raw .swatch { border-top-width: 2px; }
.legend .alarm .swatch, .legend .warning .swatch { width: 0; height: 13px; margin: 0 7px 0 4px; border-top: 0;
  border-left: 2px solid; }
.legend.empty { color: var(--body-text-color-subdued); }
"""
# The log box follows its end (as `tail -f`) unless the reader scrolled up; gradio's own autoscroll
# only follows a box that was at its end already, and a freshly filled one starts at its top.
LOG_FOLLOW = """() => { setTimeout(() => {
  const t = document.querySelector('#log-tail textarea');
  if (!t) return;
  if (!t.dataset.follow) {
    t.dataset.follow = '1';
    t.addEventListener('scroll', () => { t.dataset.follow = t.scrollTop + t.clientHeight >= t.scrollHeight - 24 ? '1' : '0'; });
  }
  if (t.dataset.follow === '1') t.scrollTop = t.scrollHeight;
}, 80); }"""
LOG_RESET = "() => { const t = document.querySelector('#log-tail textarea'); if (t) t.dataset.follow = '1'; }"


def launch_kwargs() -> dict:
    """Blocks.launch arguments that belong to this app (gradio 6 takes theme and css at launch)."""
    return {"theme": gr.themes.Default(), "css": CSS, "ssr_mode": False, "show_error": True}


def _slug(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def _panels(elem_prefix: str) -> tuple[list, list, list]:
    """(plots, legends, boxes): each panel a box holding its LinePlot and its legend, in PANELS order.

    Every plot starts from a typed empty frame with the vega legend off (the HTML legend replaces it)."""
    plots, legends, boxes = [], [], []
    for title in charts.PANELS:
        slug = _slug(title)
        with gr.Column(elem_id=f"{elem_prefix}box-{slug}", visible=title not in charts.OPTIONAL_PANELS, min_width=300) as box:
            plots.append(gr.LinePlot(charts.frame([]), x="step", y="value", color="series", label=title,
                                     elem_id=f"{elem_prefix}{slug}", height=260, x_title="step", y_title=title,
                                     colors_in_legend=[], x_lim=charts.x_range(None), min_width=300))
            legends.append(gr.HTML(charts.legend_html({}), elem_id=f"{elem_prefix}legend-{slug}", padding=False))
        boxes.append(box)
    return plots, legends, boxes


def build_app(runs_dir: Path) -> gr.Blocks:
    app = App(runs_dir)
    presets = forms.presets()
    default = DEFAULT_PRESET if DEFAULT_PRESET in presets else presets[0]
    with gr.Blocks(title="tinyrl", analytics_enabled=False) as demo:
        gr.Markdown(f"## tinyrl\nRuns in `{app.shown_dir}`. Training runs as its own process: closing this page "
                    f"(or the UI) never stops it; reopening re-attaches.")
        with gr.Tabs(selected="launch") as tabs:
            with gr.Tab("Launch", id="launch"):
                with gr.Row():
                    preset = gr.Dropdown(presets, value=default, label="preset", elem_id="preset",
                                         allow_custom_value=True)  # a typed name that is no preset gets an error
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
                    stop = gr.Button("Stop", variant="stop", elem_id="stop-btn", interactive=False)
                    resume = gr.Button("Resume", elem_id="resume-btn", interactive=False)
                    evaluate = gr.Button("Evaluate adapter", elem_id="eval-btn", interactive=False)
                    download = gr.Button("Download adapter", elem_id="download-btn", interactive=False)
                resume_over = gr.Textbox(label="resume overrides (optional, e.g. train.steps=200 to train longer)",
                                         elem_id="resume-overrides")
                action_msg = gr.Markdown(elem_id="action-msg")
                adapter_file = gr.File(label="adapter (zip)", elem_id="adapter-file", interactive=False, visible=False)
                run_status = gr.Markdown(elem_id="run-status")
                accuracy = gr.Markdown(elem_id="accuracy")
                with gr.Column(elem_id="plots"):
                    plots, legends, boxes = _panels("plot-")
                alarms_md = gr.Markdown(elem_id="alarms-words")
                alarms_df = gr.Dataframe(headers=runs_view.ALARM_HEADERS, label="alarms (evidence and suggested fix)",
                                         interactive=False, wrap=True, elem_id="alarms", visible=False,
                                         column_widths=["6%", "14%", "35%", "35%", "10%"])
                samples_df = gr.Dataframe(label="latest samples (per-component rewards)", interactive=False, wrap=True,
                                          elem_id="samples")
                eval_md = gr.Markdown(elem_id="eval-result")
                log = gr.Textbox(label="log (tail)", lines=14, max_lines=14, interactive=False, autoscroll=True,
                                 elem_id="log-tail")
            with gr.Tab("Compare", id="compare"):
                compare = gr.Dropdown([], multiselect=True, allow_custom_value=True, label="runs to compare",
                                      elem_id="compare-select")
                gr.Markdown("Each panel draws the same metric of every run (named above its legend); noisy "
                            "metrics beside their smoothed curve; alarms marked.")
                with gr.Column(elem_id="compare-plots"):
                    cplots, clegends, cboxes = _panels("cmp-")
        seen = gr.State({})
        # each tab's panel styles, sent with the data they belong to; App.restyle applies them after it
        run_styles, cmp_styles = gr.JSON(visible=False), gr.JSON(visible=False)
        timer = gr.Timer(REFRESH_S)

        form_inputs = [preset, profile, *fields, run_name, free]
        fixed = {"status": run_status, "accuracy": accuracy, "alarms_md": alarms_md, "alarms": alarms_df,
                 "samples": samples_df, "eval": eval_md, "log": log, "stop": stop, "resume": resume,
                 "evaluate": evaluate, "download": download}
        view = [fixed[k] for k in VIEW_FIXED] + plots + boxes
        cview = cplots + cboxes
        styled = plots + cplots + legends + clegends  # App.restyle's outputs
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
        styles = [run_styles, cmp_styles]
        run.change(app.selected, [run, seen], [*view, action_msg, seen, run_styles], api_visibility="private").then(
            app.restyle, styles, styled, api_visibility="private", show_progress="hidden")
        run.change(None, js=LOG_RESET)
        log.change(None, js=LOG_FOLLOW)
        runs_table.select(_row_name, runs_table, run, api_visibility="private")
        compare.change(app.compare, [compare, seen], [*cview, seen, cmp_styles], api_name="compare").then(
            app.restyle, styles, styled, api_visibility="private", show_progress="hidden")
        timer.tick(app.tick, [run, compare, seen],
                   [runs_table, run, compare, *view, action_msg, *cview, seen, *styles],
                   api_visibility="private", show_progress="hidden").then(
            app.restyle, styles, styled, api_visibility="private", show_progress="hidden")
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
