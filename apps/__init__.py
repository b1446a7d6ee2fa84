"""tinyrl's web UI (installed as `tinyrl.apps`; start it with `tinyrl ui`, needs `tinyrl-rlvr[ui]`).

The app is thin: it launches `tinyrl train` / `tinyrl eval` as subprocesses that outlive it,
and everything it shows is read back from the run folders. Modules:

    paths.py       every path that comes from the page, resolved inside the runs directory
    procs.py       pid files, liveness, signals (no gradio)
    runs_view.py   pure reads of run folders: status, metrics, samples, alarms, evaluation, log tail (no gradio)
    charts.py      the curves as drawn: typed frames, smoothed twins, alarm marks, colours, legends (no gradio)
    status.py      the words and switches: runs-table figures, enabled controls, messages (no gradio)
    forms.py       presets, the launch form, validation through tinyrl.config (no gradio)
    launcher.py    start / stop / resume / evaluate as subprocesses, the adapter zip (no gradio)
    handlers.py    the page's handlers (gradio updates from the modules above)
    ui.py          the gradio Blocks: layout and events
    server.py      `tinyrl ui`: exposure checks, then launch
"""
