"""tinyrl's web UI (installed as `tinyrl.apps`; start it with `tinyrl ui`, needs `tinyrl-rlvr[ui]`).

The app is thin: it launches `tinyrl train` / `tinyrl eval` / `tinyrl export` as subprocesses that
outlive it, everything it shows is read back from the run folders, and the Chat tab's generation is the
library's (`tinyrl.playground`). Modules:

    paths.py          every path that comes from the page, resolved inside the runs directory
    procs.py          pid files, liveness, signals (no gradio)
    runs_view.py      pure reads of run folders: status, metrics, samples, alarms, log tail (no gradio)
    runs_table.py     a run's figures: the runs table's row, held-out words, what a resume changed (no gradio)
    adapters.py       which adapter: latest, best, a checkpoint's; fingerprints (no gradio)
    evals.py          evaluations with options, kept per adapter and settings, stale when rewritten (no gradio)
    exports.py        `tinyrl export` commands, the hub login check, an export's state (no gradio)
    housekeeping.py   clone a run's launch, archive / delete (no gradio)
    data_form.py      dataset files, their columns, a prompt preview with its reward (no gradio)
    charts.py         the curves as drawn: typed frames, smoothed twins, alarm marks, colours, legends (no gradio)
    status.py         the words and switches: runs-table figures, enabled controls, messages (no gradio)
    forms.py          presets, the launch form, validation through tinyrl.config, the memory plan (no gradio)
    launcher.py       start / stop / resume / evaluate / export as subprocesses, the adapter zip (no gradio)
    handlers.py       the Runs and Compare tabs' handlers (gradio updates from the modules above)
    form_handlers.py  the Launch tab's handlers
    tool_handlers.py  the Chat and Export tabs' handlers
    ui.py             the gradio Blocks: layout and events (ui_tools.py: the Chat and Export tabs)
    server.py         `tinyrl ui`: exposure checks, then launch
"""
