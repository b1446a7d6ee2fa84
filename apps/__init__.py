"""tinyrl's web UI (installed as `tinyrl.apps`; start it with `tinyrl ui`, needs `tinyrl[ui]`).

The app is thin: it launches `tinyrl train` / `tinyrl eval` as subprocesses that outlive it,
and everything it shows is read back from the run folders. Modules:

    paths.py       every path that comes from the page, resolved inside the runs directory
    procs.py       pid files, liveness, signals (no gradio)
    runs_view.py   pure reads of run folders: status, curves, samples, alarms, log tail (no gradio)
    forms.py       presets, the launch form, validation through tinyrl.config (no gradio)
    launcher.py    start / stop / resume / evaluate as subprocesses, the adapter zip (no gradio)
    ui.py          the gradio Blocks
    server.py      `tinyrl ui`: exposure checks, then launch
"""
