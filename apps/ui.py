"""The gradio page: Launch (preset, profile, key fields, data and rewards, the async and quantization
switches, overrides, live validation, the memory planner's verdict on a chosen card, Start, which asks
first when the plan does not fit), Runs (table with s/step, ETA, best reward and held-out result; live
curves with smoothed twins and alarm marks; alarms, samples, accuracy, evaluations with their options,
log; Stop / Resume / Evaluate / adapter zip / Clone / Archive / Delete, each enabled by the run's
state), Compare (several runs on the same axes, live), Chat (ui_tools.py: base and adapter side by side)
and Export (ui_tools.py: `tinyrl export`).

This module lays the page out and wires events to the handlers (handlers.py, form_handlers.py,
tool_handlers.py); a 2-second timer re-reads the run folders and sends only what changed. Named API
endpoints (`/validate`, `/memory`, `/start`, `/stop`, `/resume`, `/evaluate`, `/download`, `/runs`,
`/run_info`, `/compare`, `/chat`, `/export`) make the same actions scriptable with gradio_client.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from tinyrl.apps import charts, evals, forms, runs_table, runs_view, ui_tools
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


# What the page shows at once when the preset changes, before the new one is validated and planned
PRESET_PENDING = "() => ['*checking the new preset …*', '', '*memory plan: once the new preset is checked …*', '']"
K_CHOICES = [1, 2, 4, 8, 16, 32]


def build_app(runs_dir: Path) -> gr.Blocks:
    app = App(runs_dir)
    with gr.Blocks(title="tinyrl", analytics_enabled=False) as demo:
        gr.Markdown(f"## tinyrl\nRuns in `{app.shown_dir}`. Training runs as its own process: closing this page "
                    f"(or the UI) never stops it; reopening re-attaches.")
        with gr.Tabs(selected="launch") as tabs:
            with gr.Tab("Launch", id="launch"):
                L = _launch_tab(app)
            with gr.Tab("Runs", id="runs"):
                R = _runs_tab()
            with gr.Tab("Compare", id="compare"):
                compare = gr.Dropdown([], multiselect=True, allow_custom_value=True, label="runs to compare",
                                      elem_id="compare-select")
                gr.Markdown("Each panel draws the same metric of every run (named above its legend); noisy "
                            "metrics beside their smoothed curve; alarms marked.")
                with gr.Column(elem_id="compare-plots"):
                    cplots, clegends, cboxes = _panels("cmp-")
            with gr.Tab("Chat", id="chat"):
                C = ui_tools.chat_tab()
            with gr.Tab("Export", id="export"):
                X = ui_tools.export_tab()
        seen = gr.State({})
        # each tab's panel styles, sent with the data they belong to; App.restyle applies them after it
        run_styles, cmp_styles = gr.JSON(visible=False), gr.JSON(visible=False)
        timer = gr.Timer(REFRESH_S)
        _wire_launch(app, L, tabs, R, demo)
        view = [R[k] for k in VIEW_FIXED] + R["plots"] + R["boxes"]
        cview = cplots + cboxes
        styled = R["plots"] + cplots + R["legends"] + clegends  # App.restyle's outputs
        styles = [run_styles, cmp_styles]
        run = R["run"]
        run.change(app.selected, [run, seen],
                   [*view, R["action_msg"], seen, run_styles, R["adapter_file"], R["confirm_row"], R["asked"]],
                   api_visibility="private").then(app.restyle, styles, styled, api_visibility="private",
                                                  show_progress="hidden")
        run.change(None, js=LOG_RESET)
        R["log"].change(None, js=LOG_FOLLOW)
        R["runs_table"].select(_row_name, R["runs_table"], run, api_visibility="private")
        compare.change(app.compare, [compare, seen], [*cview, seen, cmp_styles], api_name="compare").then(
            app.restyle, styles, styled, api_visibility="private", show_progress="hidden")
        timer.tick(app.tick, [run, compare, seen, R["eval_ckpt"]],
                   [R["runs_table"], run, compare, *view, R["action_msg"], *cview, seen, *styles],
                   api_visibility="private", show_progress="hidden").then(
            app.restyle, styles, styled, api_visibility="private", show_progress="hidden")
        _wire_runs(app, R, L, tabs)
        ui_tools.wire(app, C, X, demo)
        demo.load(lambda: gr.Dropdown(choices=runs_view.run_names(app.runs_dir), value=app.first_run()), None, run,
                  api_visibility="private")
        gr.api(app.runs, api_name="runs")
        gr.api(app.run_info, api_name="run_info")
    return demo


def _launch_tab(app: App) -> dict:
    presets = forms.presets()
    default = DEFAULT_PRESET if DEFAULT_PRESET in presets else presets[0]
    L: dict = {}
    with gr.Row():
        L["preset"] = gr.Dropdown(presets, value=default, label="preset", elem_id="preset",
                                  allow_custom_value=True)  # a typed name that is no preset gets an error
        # custom values: a profile of the previous preset, in flight while the preset changes, is no error
        L["profile"] = gr.Dropdown(forms.profile_choices(default), value="", label="profile (hardware)",
                                   elem_id="profile", allow_custom_value=True)
        L["card"] = gr.Dropdown(forms.card_choices(), value=forms.DETECTED, label="card (for the memory plan)",
                                elem_id="card")
    L["header"] = gr.Markdown(f"```text\n{forms.preset_header(default)}\n```", elem_id="preset-header")
    L["fields"], L["data"] = _form(default, app)
    with gr.Row():
        L["run_name"] = gr.Textbox(label="run name (optional; default: preset + time)", elem_id="run-name")
        L["free"] = gr.Textbox(label="more overrides (section.field=value, space or newline separated)",
                               lines=2, placeholder="algo.beta=0.04 train.save_every=10", elem_id="overrides")
    L["validation"] = gr.Markdown(elem_id="validation")
    L["command"] = gr.Code(language="shell", label="the command the UI runs", elem_id="command", interactive=False)
    L["memory"] = gr.Markdown(elem_id="memory")
    with gr.Accordion("memory plan: every component", open=False, elem_id="memory-table-box"):
        L["memory_table"] = gr.Markdown(elem_id="memory-table")
    L["start"] = gr.Button("Start", variant="primary", elem_id="start-btn")
    with gr.Row(visible=False, elem_id="fit-confirm") as L["confirm_row"]:
        L["confirm_md"] = gr.Markdown(elem_id="fit-words")
        L["force"] = gr.Button("Start anyway", variant="stop", elem_id="start-anyway-btn")
        L["apply_fit"] = gr.Button("Apply the largest settings that fit", elem_id="apply-fit-btn")
    L["start_msg"] = gr.Markdown(elem_id="start-msg")
    L["api_start"] = gr.Button(visible=False)  # `/start` for API clients: a refusal is an error there
    L["pending"], L["card_set"] = gr.State(None), gr.State(None)
    return L


def _runs_tab() -> dict:
    R: dict = {}
    R["runs_table"] = gr.Dataframe(headers=runs_table.TABLE_HEADERS, interactive=False, elem_id="runs-table",
                                   max_height=260)
    with gr.Row():
        R["run"] = gr.Dropdown([], allow_custom_value=True, label="run", elem_id="run-select", scale=3)
        R["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn", interactive=False)
        R["resume"] = gr.Button("Resume", elem_id="resume-btn", interactive=False)
        R["evaluate"] = gr.Button("Evaluate adapter", elem_id="eval-btn", interactive=False)
        R["download"] = gr.Button("Download adapter", elem_id="download-btn", interactive=False)
    with gr.Row():
        R["resume_over"] = gr.Textbox(label="resume overrides (optional, e.g. train.steps=200 to train longer)",
                                      elem_id="resume-overrides", scale=4)
        R["clone"] = gr.Button("Clone settings into Launch", elem_id="clone-btn", interactive=False, size="sm")
        R["archive"] = gr.Button("Archive…", elem_id="archive-btn", interactive=False, size="sm")
        R["delete"] = gr.Button("Delete…", variant="stop", elem_id="delete-btn", interactive=False, size="sm")
    with gr.Row(visible=False, elem_id="remove-confirm") as R["confirm_row"]:
        R["confirm_md"] = gr.Markdown(elem_id="remove-words")
        R["confirm"] = gr.Button("Yes, do it", variant="stop", elem_id="remove-yes-btn")
        R["cancel"] = gr.Button("Cancel", elem_id="remove-cancel-btn")
    R["asked"] = gr.State(None)
    with gr.Accordion("evaluation options", open=True, elem_id="eval-options"):
        with gr.Row():
            R["eval_ckpt"] = gr.Dropdown([], label="adapter to evaluate", elem_id="eval-ckpt", allow_custom_value=True)
            R["eval_samples"] = gr.Number(0, label="samples per prompt (0: greedy pass@1 only)", precision=0,
                                          minimum=0, elem_id="eval-samples")
            R["eval_k"] = gr.CheckboxGroup(K_CHOICES, value=[1], label="k of pass@k / maj@k (k <= samples)",
                                           elem_id="eval-k")
            R["eval_prompts"] = gr.Number(0, label="held-out prompts (0: the run's data.num_eval)",
                                          precision=0, minimum=0, elem_id="eval-prompts")
    R["action_msg"] = gr.Markdown(elem_id="action-msg")
    R["adapter_file"] = gr.File(label="adapter (zip)", elem_id="adapter-file", interactive=False, visible=False)
    R["status"] = gr.Markdown(elem_id="run-status")
    R["accuracy"] = gr.Markdown(elem_id="accuracy")
    with gr.Column(elem_id="plots"):
        R["plots"], R["legends"], R["boxes"] = _panels("plot-")
    R["alarms_md"] = gr.Markdown(elem_id="alarms-words")
    R["alarms"] = gr.Dataframe(headers=runs_view.ALARM_HEADERS, label="alarms (evidence and suggested fix)",
                               interactive=False, wrap=True, elem_id="alarms", visible=False,
                               column_widths=["6%", "14%", "35%", "35%", "10%"])
    R["samples"] = gr.Dataframe(label="latest samples (per-component rewards)", interactive=False, wrap=True,
                                elem_id="samples")
    R["eval"] = gr.Markdown(elem_id="eval-result")
    R["evals"] = gr.Dataframe(headers=evals.HEADERS, label="evaluations (one row per adapter and settings)",
                              interactive=False, wrap=True, elem_id="eval-table", visible=False)
    R["log"] = gr.Textbox(label="log (tail)", lines=14, max_lines=14, interactive=False, autoscroll=True,
                          elem_id="log-tail")
    return R


def _wire_launch(app: App, L: dict, tabs, R: dict, demo: gr.Blocks) -> None:
    f = app.form
    preset, profile, card = L["preset"], L["profile"], L["card"]
    form_inputs = [preset, profile, *L["fields"], L["run_name"], L["free"]]
    preset.change(None, None, [L["validation"], L["command"], L["memory"], L["memory_table"]], js=PRESET_PENDING)
    # Checked on what the user edits (.input) and after each handler that fills the form (chained): a
    # form filled by a handler sends its components' change events one by one, and a check started by the
    # first would read the others' old values (the old preset's fields passed off as the new preset's).
    # Each check runs in one queue of its own (concurrency_id), whoever asks for it: gradio's default queue is
    # per listener, so a plan chained after a preset change and one asked for by a card change ran side by side
    # and the older (the detected card's) could finish last and stay on the panel. One queue, first in first out,
    # and each request reading the form when it is sent: the last asked is the last shown.
    checks = [(f.validate, form_inputs, [L["validation"], L["command"]], "validate"),
              (f.memory, [*form_inputs, card], [L["memory"], L["memory_table"]], "memory")]

    def then_check(event):
        for fn, inputs, outputs, queue in checks:
            event = event.then(fn, inputs, outputs, api_visibility="private", show_progress="minimal",
                               concurrency_id=queue, concurrency_limit=1)
        return event

    L["then_check"] = then_check
    edits = [c.input for c in [*L["fields"], L["run_name"], L["free"]]]
    # (first: the API names go to the first event of a function, private or not)
    # one listener each, the page's load among its triggers: a check still running from the load is followed
    # by the one an edit asks for (always_last), never finishes after it with the form as it loaded
    gr.on([demo.load, *edits], f.validate, form_inputs, [L["validation"], L["command"]], trigger_mode="always_last",
          api_name="validate", concurrency_id="validate", concurrency_limit=1)
    gr.on([demo.load, *edits, card.change], f.memory, [*form_inputs, card], [L["memory"], L["memory_table"]],
          trigger_mode="always_last", api_name="memory", concurrency_id="memory", concurrency_limit=1)
    then_check(preset.change(f.preset_changed, [preset, L["pending"]],
                             [L["header"], profile, *L["fields"], L["pending"]], api_visibility="private"))
    then_check(profile.input(f.form_for, [preset, profile, L["pending"]], L["fields"], api_visibility="private"))
    profile.change(f.profile_card, [profile, card, L["card_set"]], [card, L["card_set"]], api_visibility="private")
    started = [L["start_msg"], R["run"], tabs, L["confirm_row"], L["confirm_md"], L["apply_fit"]]
    L["start"].click(f.start_form, [*form_inputs, card, gr.State(False)], started, api_visibility="private")
    L["force"].click(f.start_form, [*form_inputs, card, gr.State(True)], started, api_visibility="private")
    then_check(L["apply_fit"].click(f.apply_fit, [*form_inputs, card],
                                    [*L["fields"], L["free"], L["start_msg"], L["confirm_row"]], api_visibility="private"))
    L["api_start"].click(f.start, form_inputs, [L["start_msg"], R["run"], tabs], api_name="start")
    d = L["data"]
    d["upload"].upload(f.upload, d["upload"], [d["dataset"], d["note"]], api_visibility="private")
    then_check(d["dataset"].change(f.columns, [d["dataset"], d["prompt_col"], d["answer_col"]],
                                   [d["prompt_col"], d["answer_col"], d["note"]], api_visibility="private"))
    d["preview_btn"].click(f.preview, [*form_inputs, d["sample"]], d["preview"], api_name="preview")


def _wire_runs(app: App, R: dict, L: dict, tabs) -> None:
    run = R["run"]
    R["stop"].click(app.stop, run, R["action_msg"], api_name="stop")
    R["resume"].click(app.resume, [run, R["resume_over"]], R["action_msg"], api_name="resume")
    R["evaluate"].click(app.evaluate, [run, R["eval_ckpt"], R["eval_samples"], R["eval_k"], R["eval_prompts"]],
                        R["action_msg"], api_name="evaluate")
    R["download"].click(app.download, run, R["adapter_file"], api_name="download")
    asked = [R["confirm_row"], R["confirm_md"], R["asked"]]
    R["archive"].click(app.archive, run, asked, api_visibility="private")
    R["delete"].click(app.delete, run, asked, api_visibility="private")
    R["cancel"].click(lambda: (gr.Row(visible=False), None), None, [R["confirm_row"], R["asked"]],
                      api_visibility="private")
    R["confirm"].click(app.confirm_remove, R["asked"], [R["action_msg"], R["confirm_row"], run],
                       api_visibility="private")
    L["then_check"](R["clone"].click(app.form.clone, run, [L["preset"], L["profile"], *L["fields"], L["run_name"],
                                                           L["free"], tabs, L["start_msg"], R["action_msg"],
                                                           L["pending"]], api_visibility="private"))


def _form(preset: str, app: App) -> tuple[list, dict]:
    """The key fields, filled with the preset's values (order: forms.KEYS), and the data section's other parts."""
    from tinyrl.algo.recipes import RECIPES
    from tinyrl.tasks import TASKS

    v = forms.form_values(preset, None)
    lb = forms.LABELS
    with gr.Row():
        model = gr.Textbox(v["model.name"], label=lb["model.name"], elem_id="f-model")
        task = gr.Dropdown(sorted(TASKS) + ["jsonl", "dataset"], value=v["data.task"], label=lb["data.task"],
                           allow_custom_value=True, elem_id="f-task")
        recipe = gr.Dropdown([forms.NO_RECIPE, *RECIPES], value=v["algo.recipe"] or forms.NO_RECIPE,
                             label=lb["algo.recipe"], allow_custom_value=True, elem_id="f-recipe")
        four_bit = gr.Checkbox(v["model.load_in_4bit"], label=lb["model.load_in_4bit"], elem_id="f-4bit")
    with gr.Row():
        num = {k: gr.Number(v[k], label=lb[k], precision=None if k == "train.lr" else 0, elem_id=eid)
               for k, eid in (("train.steps", "f-steps"), ("train.lr", "f-lr"), ("rollout.num_generations", "f-group"),
                              ("train.prompts_per_step", "f-prompts"), ("lora.r", "f-lora-r"),
                              ("rollout.max_new_tokens", "f-max-new"))}
    data: dict = {}
    with gr.Accordion("data and rewards", open=False, elem_id="data-box"):
        gr.Markdown("Train on your own rows: upload a .jsonl / .json / .csv / .parquet file (kept in the runs "
                    "directory's `data/`) or name a hub dataset (owner/name), map its columns, then preview one "
                    "prompt as the run will see it and the reward the task's verifier gives a sample answer.")
        with gr.Row():
            dataset = gr.Dropdown([("", "")] + app.form.dataset_choices(), value=v["data.dataset"] or "",
                                  label=lb["data.dataset"], allow_custom_value=True, elem_id="f-dataset", scale=3)
            data["upload"] = gr.UploadButton("Upload a data file", file_types=[".jsonl", ".json", ".csv", ".parquet"],
                                             elem_id="data-upload")
        with gr.Row():
            prompt_col = gr.Dropdown([""], value=v["data.columns.prompt"] or "", label=lb["data.columns.prompt"],
                                     allow_custom_value=True, elem_id="f-prompt-col")
            answer_col = gr.Dropdown([("found by name (answer, solution)", forms.AUTO_ANSWER),
                                      ("none: no gold answer, no verifier", forms.NO_ANSWER)],
                                     value=v["data.columns.answer"], label=lb["data.columns.answer"],
                                     allow_custom_value=True, elem_id="f-answer-col")
        data["note"] = gr.Markdown(elem_id="data-note")
        with gr.Row():
            data["sample"] = gr.Textbox(label="sample answer (empty: the row's gold answer, as the verifier reads it)",
                                        elem_id="sample-answer", scale=3)
            data["preview_btn"] = gr.Button("Preview a prompt and its reward", elem_id="preview-btn")
        data["preview"] = gr.Markdown(elem_id="data-preview")
    with gr.Accordion("rollout and model switches", open=False, elem_id="switches-box"):
        with gr.Row():
            quant = gr.Dropdown(["none", "int8", "fp8"], value=v["model.quantization"], label=lb["model.quantization"],
                                elem_id="f-quant")
            stale = gr.Number(v["rollout.max_staleness"], label=lb["rollout.max_staleness"], precision=0, minimum=0,
                              elem_id="f-staleness")
            overlap = gr.Checkbox(v["rollout.overlap"], label=lb["rollout.overlap"], elem_id="f-overlap")
            streaming = gr.Checkbox(v["agent.streaming"], label=lb["agent.streaming"], elem_id="f-streaming")
    data.update(dataset=dataset, prompt_col=prompt_col, answer_col=answer_col)
    by_key = {"model.name": model, "data.task": task, "algo.recipe": recipe, "model.load_in_4bit": four_bit, **num,
              "data.dataset": dataset, "data.columns.prompt": prompt_col, "data.columns.answer": answer_col,
              "model.quantization": quant, "rollout.max_staleness": stale, "rollout.overlap": overlap,
              "agent.streaming": streaming}
    return [by_key[k] for k in forms.KEYS], data


def _row_name(table, evt: gr.SelectData):
    try:
        return table.iloc[evt.index[0], 0]
    except (IndexError, KeyError, TypeError, AttributeError):
        return gr.skip()
