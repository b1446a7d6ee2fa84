"""The Chat and Export tabs' handlers (gradio updates; the work is tinyrl.playground's and `tinyrl export`'s).

Chat: one `tinyrl.playground.Playground` per (run, adapter folder, its fingerprint) is kept loaded (the two
most recent), so a second prompt costs no load and a resumed run's rewritten adapter is loaded again. The
chat handler is a generator: gradio runs it on a worker thread and sends each yield, so the page shows
"loading" at once and both answers as they grow, and the server's event loop never waits on a model.

Export: the choice becomes `tinyrl export ...` as a process (launcher.export); its state is read back from
the run folder (exports.state) on the tools' timer.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import gradio as gr
import pandas as pd

from tinyrl.apps import adapters, exports, runs_view
from tinyrl.apps import status as st
from tinyrl.apps.forms import MODEL_STACK
from tinyrl.apps.launcher import LaunchError
from tinyrl.apps.paths import UnsafePathError

ERRORS = (UnsafePathError, LaunchError, FileNotFoundError, PermissionError, ValueError, OSError)
KEEP_LOADED = 2


def gold_of(row: dict):
    return next((g for g in (row.get("gold"), row.get("answer"), *(row.get("golden_answers") or [])[:1])
                 if g not in (None, "")), None)


def verdict_words(ok: bool | None, row: dict | None) -> str:
    if row is None:
        return "no verdict: **sample a held-out prompt** to have the task's verifier judge the answers"
    if ok is None:
        return "no verdict: this run's task has no verifier"
    gold = gold_of(row)
    return ("**✓ correct**" if ok else "**✗ wrong**") + (f" (gold answer: `{gold}`)" if gold is not None else "")


def turns_text(turns: list[dict]) -> str:
    """An agent episode's turns as the rollout logged them: model turns with their tool calls, observations."""
    out = []
    for i, t in enumerate(turns, 1):
        text = t.get("text", "").replace("`", "'")
        if t.get("role") == "tool":
            errs = f" (tool errors: {', '.join(map(str, t['errors']))})" if t.get("errors") else ""
            out.append(f"{i}. **observation** (masked out of the loss){errs}: `{text}`")
        else:
            calls = "; ".join(f"{c['name']}({', '.join(f'{k}={v!r}' for k, v in c['arguments'].items())})"
                              for c in t.get("calls") or [])
            out.append(f"{i}. **model**: `{text}`" + (f" → calls {calls}" if calls else ""))
    return "\n".join(out)


class ToolHandlers:
    def __init__(self, app):
        self.app, self.runs_dir = app, app.runs_dir
        self._loaded: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()  # one load at a time

    # ------------------------------------------------------------------ chat

    def adapter_choices(self, run):
        """The checkpoint dropdown for a run (latest first) and its default max new tokens."""
        if not run:
            return gr.Dropdown(choices=[], value=None), gr.skip(), ""
        try:
            path = self.app.launcher.run_path(run)
        except ERRORS as e:
            return gr.skip(), gr.skip(), f"**{self.app.shown(str(e))}**"
        choices = adapters.choices(path)
        max_new = (runs_view.run_config(path).get("rollout") or {}).get("max_new_tokens")
        note = "" if choices else f"**{run}** has no adapter yet: the first checkpoint saves one"
        return gr.Dropdown(choices=choices, value=adapters.LATEST if choices else None), \
            max_new if isinstance(max_new, int) else gr.skip(), note

    def playground(self, run: str, choice: str):
        """The loaded playground of a run's chosen adapter (loaded now when it is not kept)."""
        with MODEL_STACK:
            from tinyrl.playground import Playground  # the model stack: loaded with the first chat
        path = self.app.launcher.run_path(run)
        key_name, adapter = adapters.resolve(path, choice)
        key = (str(path), str(adapter), adapters.fingerprint(adapter))
        with self._lock, MODEL_STACK:
            if key not in self._loaded:
                self._loaded[key] = Playground.load(path, adapter)
                while len(self._loaded) > KEEP_LOADED:
                    self._loaded.popitem(last=False)
            self._loaded.move_to_end(key)
            return self._loaded[key], adapters.label_of(key_name)

    def sample(self, run, choice, asked):
        """The next held-out prompt of the run (in order: 1, 2, ...), remembered for the verdict."""
        try:
            pg, _ = self.playground(run or "", choice)
            index = (asked or {}).get("index", -1) + 1 if (asked or {}).get("run") == run else 0
            row = pg.held_out_row(index)
        except ERRORS as e:
            return gr.skip(), gr.skip(), f"**no prompt:** {self.app.shown(str(e))}"
        return row["prompt"], {"run": run, "index": index, "prompt": row["prompt"]}, \
            f"held-out prompt {index % len(pg.held_out) + 1} of {len(pg.held_out)}; gold answer hidden until you Generate"

    def chat(self, run, choice, prompt, temperature, max_new, asked):
        """Both answers as they grow: (base, adapter, base verdict, adapter verdict, base turns, adapter turns, status)."""
        if not (prompt or "").strip():
            yield "", "", "", "", "", "", "type a prompt, or **sample a held-out prompt**"
            return
        yield "", "", "", "", "", "", f"loading **{run}** …"  # (the last prompt's answers go)
        try:
            t0 = time.monotonic()
            pg, label = self.playground(run or "", choice)
            loaded = time.monotonic() - t0
            row = None
            if asked and asked.get("run") == run and asked.get("prompt", "").strip() == prompt.strip():
                row = pg.held_out_row(asked["index"])
                prompt = row["prompt"]  # exactly as the run's rows have it (a text box drops a final newline)
            base = tuned = None
            status = f"**{run}**, {label}; temperature {float(temperature or 0):g}"
            for base, tuned in pg.chat(prompt, float(temperature or 0), int(max_new) if max_new else None,
                                       row=row):
                yield (base.text, tuned.text, "", "", turns_text(base.turns), turns_text(tuned.turns),
                       f"{status}: generating … base {base.tokens}, adapter {tuned.tokens} tokens")
        except ERRORS as e:
            yield gr.skip(), gr.skip(), "", "", "", "", f"**no answer:** {self.app.shown(str(e))}"
            return
        verdicts = [verdict_words(pg.verdict(row, s.text) if row else None, row) for s in (base, tuned)]
        ends = f"base ended by {base.finish} after {base.tokens} tokens, adapter by {tuned.finish} after {tuned.tokens} tokens"
        yield (base.text, tuned.text, *verdicts, turns_text(base.turns), turns_text(tuned.turns),
               f"{status}: done; {ends}" + (f" (model loaded in {loaded:.1f} s)" if loaded > 0.5 else ""))

    # ------------------------------------------------------------------ export

    def login(self, push):
        """The hub login check, shown as soon as a repo is named (before any work)."""
        if not (push or "").strip():
            return "no upload: give a hub repo (USER/NAME) to push the export there"
        return exports.login_state()[1]

    def gguf_control(self):
        """The export kinds offered, and the GGUF type control: usable, or disabled with the reason."""
        missing = exports.gguf_missing()
        kinds = [(v, k) for k, v in exports.KINDS.items() if k != "gguf" or not missing]
        return gr.Radio(choices=kinds), gr.Dropdown(interactive=missing is None, info=missing or
                                                    "the GGUF file's tensor type (used with the GGUF kind)")

    def start_export(self, run, kind, dtype, name, push, private, gguf_type):
        try:
            return self.app.shown(self.app.launcher.export(run or "", kind or "merged", name or "", dtype or "bfloat16",
                                                           push or "", bool(private), gguf_type or "f16"))
        except ERRORS as e:
            return f"**not exported:** {self.app.shown(str(e))}"

    def export_view(self, run) -> list:
        """(status words, log tail, files table, model card, card box shown) of the run's last export."""
        if not run:
            return ["", "", gr.Dataframe(visible=False), "", gr.Accordion(visible=False)]
        try:
            self.app.launcher.run_path(run)
        except ERRORS as e:
            return [f"**{self.app.shown(str(e))}**", "", gr.Dataframe(visible=False), "", gr.Accordion(visible=False)]
        s = exports.state(self.runs_dir, run)
        if s["state"] == "none":
            words = f"no export of **{run}** yet"
        else:
            where = f"`{self.app.shown(str(s['out_path']))}`" if s.get("out_path") else "the hub"
            what = f"{exports.KINDS[s['kind']]} → {where}" + (f", pushed to `{s['push']}`" if s.get("push") else "")
            words = {"running": f"**exporting** {what} … running for {st.duration(s.get('elapsed'))} "
                                f"(the log's end is below)",
                     "done": f"**exported** {what} (started {s['at']})" + (f"; on the hub: {s['url']}" if s.get("url") else ""),
                     "failed": f"**export failed** ({what}): `{self.app.shown(str(s.get('error')))}`"}[s["state"]]
        files = s.get("files") or []
        table = gr.Dataframe(pd.DataFrame([[n, exports.size_text(b)] for n, b in files], columns=["file", "size"]),
                             visible=bool(files))
        card = s.get("card") or ""
        return [words, self.app.shown(s.get("log", "")), table, card, gr.Accordion(visible=bool(card))]

    def tick(self, export_run, seen):
        """The tools' timer: the run choices of the Chat and Export tabs, and the export's state when it changed."""
        seen = dict(seen or {})
        names = runs_view.run_names(self.runs_dir)
        choices = [gr.skip(), gr.skip()] if names == seen.get("names") else [gr.Dropdown(choices=names)] * 2
        seen["names"] = names
        view = self.export_view(export_run)
        sig = [export_run, view[0], view[1], repr(getattr(view[2], "value", None)), view[3]]
        if sig == seen.get("export"):
            view = [gr.skip()] * len(view)
        seen["export"] = sig
        return [*choices, *view, seen]
