"""The Chat and Export tabs: their layout and events (handlers: tool_handlers.py).

Chat: a run and one of its adapters (latest, best reward, any kept checkpoint), a prompt (typed, or the
run's next held-out prompt), temperature and max new tokens; the base model's answer beside the trained
adapter's, both streamed token by token, the task verifier's verdict under each for a held-out prompt,
and for agent runs the turns (tool calls, observations) as the rollout logs them.

Export: `tinyrl export` of a run's final adapter: the merged model in a dtype, the adapter alone, or a
GGUF file (offered when the CLI has it; else its control is disabled and says why); an optional upload
to the hub, with the login checked and shown before any work; the export's progress, then its folder,
files and model card. A timer of its own (every 2 s) follows the export and refreshes the run choices.
"""

from __future__ import annotations

import gradio as gr

from tinyrl.apps import exports, runs_view

TOOLS_REFRESH_S = 2.0


def chat_tab() -> dict:
    C: dict = {}
    gr.Markdown("The trained adapter's answer beside the base model's (the same model with the adapter switched "
                "off), on the prompt as the run's rollout renders it. **Sample a held-out prompt** to see the task "
                "verifier's verdict on both.")
    with gr.Row():
        C["run"] = gr.Dropdown([], label="run", elem_id="chat-run", allow_custom_value=True, scale=2)
        C["ckpt"] = gr.Dropdown([], label="adapter (checkpoint)", elem_id="chat-ckpt", allow_custom_value=True,
                                scale=2)
    C["prompt"] = gr.Textbox(label="prompt (the user's text; the run's chat template and agent instructions are added)",
                             lines=3, elem_id="chat-prompt")
    with gr.Row():
        C["sample"] = gr.Button("Sample a held-out prompt", elem_id="chat-sample-btn")
        C["temperature"] = gr.Slider(0, 2, value=0, step=0.1, label="temperature (0: greedy)", elem_id="chat-temp")
        C["max_new"] = gr.Number(None, label="max new tokens (empty: the run's)", precision=0,
                                 elem_id="chat-max-new")
        C["go"] = gr.Button("Generate", variant="primary", elem_id="chat-go-btn")
    C["status"] = gr.Markdown(elem_id="chat-status")
    with gr.Row():
        for side, title in (("base", "base model (adapter off)"), ("adapter", "trained adapter")):
            with gr.Column():
                C[side] = gr.Textbox(label=title, lines=5, interactive=False, elem_id=f"chat-{side}")
                C[f"{side}_verdict"] = gr.Markdown(elem_id=f"chat-{side}-verdict")
                C[f"{side}_turns"] = gr.Markdown(elem_id=f"chat-{side}-turns")
    C["asked"] = gr.State(None)
    return C


def export_tab() -> dict:
    X: dict = {}
    gr.Markdown("Export a finished run with `tinyrl export` (its own process): the base with the adapter merged in, "
                "or the adapter alone, into the run folder's `exports/`; optionally uploaded to the Hugging Face Hub "
                "with a model card.")
    with gr.Row():
        X["run"] = gr.Dropdown([], label="run", elem_id="export-run", allow_custom_value=True, scale=2)
        # every kind here (an API client may ask for any; launcher.export refuses GGUF where the CLI lacks it);
        # the page's load hides GGUF there and disables its control with the reason (gguf_control)
        X["kind"] = gr.Radio([(v, k) for k, v in exports.KINDS.items()], value="merged", label="what",
                             elem_id="export-kind", scale=3)
    with gr.Row():
        X["dtype"] = gr.Dropdown(list(exports.DTYPES), value="bfloat16", label="merged weights' dtype",
                                 elem_id="export-dtype")
        X["gguf_type"] = gr.Dropdown(list(exports.GGUF_TYPES), value="f16", label="GGUF type", interactive=False,
                                     elem_id="export-gguf-type")
        X["name"] = gr.Textbox(label="folder name in exports/ (empty: merged-<dtype>, adapter, model-<type>.gguf)",
                               elem_id="export-name")
    with gr.Row():
        X["push"] = gr.Textbox(label="push to the hub (USER/NAME; empty: no upload)", elem_id="export-push", scale=3)
        X["private"] = gr.Checkbox(False, label="private repo", elem_id="export-private")
    X["login"] = gr.Markdown(elem_id="export-login")
    X["go"] = gr.Button("Export", variant="primary", elem_id="export-btn")
    X["msg"] = gr.Markdown(elem_id="export-msg")
    X["status"] = gr.Markdown(elem_id="export-status")
    X["log"] = gr.Textbox(label="export log (tail)", lines=6, max_lines=6, interactive=False, elem_id="export-log")
    X["files"] = gr.Dataframe(label="written", interactive=False, visible=False, elem_id="export-files")
    with gr.Accordion("model card (README.md)", open=True, visible=False, elem_id="export-card-box") as X["card_box"]:
        X["card"] = gr.Markdown(elem_id="export-card")
    X["seen"] = gr.State({})
    return X


def wire(app, C: dict, X: dict, demo: gr.Blocks) -> None:
    """The Chat and Export tabs' events; when the page opens both show the run the Runs tab shows first."""
    t = app.tools
    C["run"].change(t.adapter_choices, C["run"], [C["ckpt"], C["max_new"], C["status"]], api_visibility="private")
    C["sample"].click(t.sample, [C["run"], C["ckpt"], C["asked"]], [C["prompt"], C["asked"], C["status"]],
                      api_name="sample_prompt")
    C["go"].click(t.chat, [C["run"], C["ckpt"], C["prompt"], C["temperature"], C["max_new"], C["asked"]],
                  [C["base"], C["adapter"], C["base_verdict"], C["adapter_verdict"], C["base_turns"],
                   C["adapter_turns"], C["status"]], api_name="chat", show_progress="minimal")
    view = [X["status"], X["log"], X["files"], X["card"], X["card_box"]]
    X["push"].change(t.login, X["push"], X["login"], api_visibility="private")
    X["go"].click(t.start_export, [X["run"], X["kind"], X["dtype"], X["name"], X["push"], X["private"],
                                   X["gguf_type"]], X["msg"], api_name="export").then(
        t.export_view, X["run"], view, api_visibility="private")
    X["run"].change(t.export_view, X["run"], view, api_visibility="private")
    timer = gr.Timer(TOOLS_REFRESH_S)
    timer.tick(t.tick, [X["run"], X["seen"]], [C["run"], X["run"], *view, X["seen"]], api_visibility="private",
               show_progress="hidden")
    demo.load(t.gguf_control, None, [X["kind"], X["gguf_type"]], api_visibility="private")
    demo.load(t.login, X["push"], X["login"], api_visibility="private")
    demo.load(lambda: [gr.Dropdown(choices=runs_view.run_names(app.runs_dir), value=app.first_run())] * 2, None,
              [C["run"], X["run"]], api_visibility="private")
