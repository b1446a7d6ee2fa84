"""The Launch tab's handlers: preset and profile, live validation and the memory plan, Start (with a
confirmation when the plan says DOES NOT FIT), the data section (dataset files, column mapping, preview),
and the form filled from a run to clone. Thin: forms.py, data_form.py and the launcher do the work.

A clone fills the form in one go and leaves `pending` (a gr.State: preset, profile, the field values): the
preset and profile change events that the filling sets off then put those values in, not the preset's.
"""

from __future__ import annotations

import gradio as gr

from tinyrl.apps import data_form, forms, housekeeping, runs_view
from tinyrl.apps.launcher import LaunchError
from tinyrl.apps.paths import UnsafePathError, check_name
from tinyrl.config import ConfigError, parse_override

ERRORS = (UnsafePathError, LaunchError, ConfigError, FileNotFoundError, PermissionError, OSError)


def field_value(key: str, value):
    """A config value as its form field holds it."""
    return forms.NO_RECIPE if key == "algo.recipe" and value is None else "" if value is None else value


class FormHandlers:
    def __init__(self, app):
        self.app, self.launcher, self.runs_dir = app, app.launcher, app.runs_dir

    def _plan(self, preset, profile, values, free) -> forms.Plan:
        forms.check_preset(preset)
        return forms.validate(preset, profile, dict(zip(forms.KEYS, values)), free)

    # ------------------------------------------------------------------ preset, profile, card

    def preset_changed(self, preset: str, pending):
        """The preset's header, profiles and field values (a pending clone's where it is this preset's);
        a name that is no shipped preset gets the error."""
        try:
            forms.check_preset(preset)
        except ConfigError as e:
            return (f"**tinyrl: error:** `{e}`", gr.skip(), *[gr.skip()] * len(forms.KEYS), pending)
        mine = pending if pending and pending.get("preset") == preset else None
        header = f"```text\n{forms.preset_header(preset)}\n```"
        profile = gr.Dropdown(choices=forms.profile_choices(preset), value=(mine or {}).get("profile") or "")
        return (header, profile, *self.form_for(preset, (mine or {}).get("profile") or "", mine), mine)

    def form_for(self, preset: str, profile: str, pending=None):
        if pending and pending.get("preset") == preset and (pending.get("profile") or "") == (profile or ""):
            return [pending["values"][k] for k in forms.KEYS]
        try:
            values = forms.form_values(preset, profile or None)
        except ConfigError:
            return [gr.skip()] * len(forms.KEYS)  # the validation line says why
        return [field_value(k, v) for k, v in values.items()]

    def profile_card(self, profile, card, set_by_profile):
        """A profile that names a card (24gb -> L4) chooses it for the plan; cleared, the card it chose goes back
        to the detected one (a card the user picked stays). Returns (card, the card a profile set)."""
        named = forms.card_for_profile(profile)
        if named:
            return named, named
        if set_by_profile and card == set_by_profile:
            return forms.DETECTED, None
        return gr.skip(), None

    # ------------------------------------------------------------------ validation and the memory plan

    def validate(self, preset, profile, *rest):
        """(validation message, command line) for the form as it stands."""
        *values, name, free = rest
        try:
            plan = self._plan(preset, profile, values, free)
            if name:
                check_name(name)
        except (ConfigError, UnsafePathError) as e:
            return f"**tinyrl: error:** `{self.app.shown(str(e))}`", ""
        return f"valid: {forms.summary(plan.config)}", self.app.shown(plan.shown())

    def memory(self, preset, profile, *rest):
        """(verdict, the whole plan) of the memory planner for the form as it stands on the chosen card."""
        *values, _name, free, card = rest
        try:
            plan = self._plan(preset, profile, values, free)
        except ConfigError:
            return "**memory plan:** none until the form is valid (see above)", ""
        est = forms.memory_estimate(plan.config, card, profile or None)
        return f"**memory plan** (`tinyrl plan`)\n```text\n{est.summary}\n```", \
            f"```text\n{est.table}\n```" if est.table else ""

    # ------------------------------------------------------------------ Start

    def start(self, preset, profile, *rest):
        """Start a run (the API: refusals are errors)."""
        *values, name, free = rest
        try:
            plan = self._plan(preset, profile, values, free)
            run = self.launcher.start(plan, name.strip() or None)
        except ERRORS as e:
            raise gr.Error(self.app.shown(str(e)), print_exception=False) from None
        return self._started(run, plan), gr.Dropdown(choices=runs_view.run_names(self.runs_dir), value=run), \
            gr.Tabs(selected="runs")

    def _started(self, run: str, plan: forms.Plan) -> str:
        log = self.app.shown(str(runs_view.staging_file(self.runs_dir, run, "train", "log")))
        return f"started **{run}**: `{self.app.shown(plan.shown())}` (log: `{log}` until its folder exists)"

    def start_form(self, preset, profile, *rest):
        """Start from the page: a refusal stays on the page as the message (the reason, in the page's words); a
        plan that does not fit the chosen card asks first (Start anyway / apply the largest settings that fit).
        Outputs: message, run dropdown, tabs, confirmation row, its words, the apply button."""
        *values, name, free, card, force = rest
        hide = gr.Row(visible=False)
        try:
            plan = self._plan(preset, profile, values, free)
            if name:
                check_name(name)
            est = forms.memory_estimate(plan.config, card, profile or None)
            if est.fits is False and not force:
                verdict = next((ln for ln in est.summary.splitlines() if ln.startswith("verdict:")), est.summary)
                fit = f" or apply the largest settings that fit (`{' '.join(est.fit)}`)" if est.fit else \
                    " (no micro-batch, group size or token budget alone makes it fit: load the base in 4-bit or pick a bigger card)"
                words = f"**not started yet** — the memory plan says {verdict}. Start anyway{fit}?"
                return words, gr.skip(), gr.skip(), gr.Row(visible=True), words, gr.Button(interactive=bool(est.fit))
            run = self.launcher.start(plan, name.strip() or None)
        except ERRORS as e:
            return f"**not started:** {self.app.shown(str(e))}", gr.skip(), gr.skip(), hide, "", gr.skip()
        return self._started(run, plan), gr.Dropdown(choices=runs_view.run_names(self.runs_dir), value=run), \
            gr.Tabs(selected="runs"), hide, "", gr.skip()

    def apply_fit(self, preset, profile, *rest):
        """The largest settings that fit, put in the form (a form field, else the free overrides)."""
        *values, _name, free, card = rest
        try:
            plan = self._plan(preset, profile, values, free)
        except ConfigError as e:
            return (*[gr.skip()] * len(forms.KEYS), gr.skip(), f"**not applied:** {e}", gr.Row(visible=False))
        fit = forms.memory_estimate(plan.config, card, profile or None).fit
        fields, free_tokens = list(values), forms.split_overrides(free)
        for token in fit:
            key = ".".join(parse_override(token)[0])
            free_tokens = [t for t in free_tokens if ".".join(parse_override(t)[0]) != key]
            if key in forms.KEYS:
                fields[forms.KEYS.index(key)] = parse_override(token)[1]
            else:
                free_tokens.append(token)
        msg = f"applied `{' '.join(fit)}`: the plan is made again below" if fit else "nothing to apply"
        return (*fields, " ".join(free_tokens), msg, gr.Row(visible=False))

    # ------------------------------------------------------------------ data and rewards

    def dataset_choices(self) -> list[tuple[str, str]]:
        """(shown, value) of the dataset files kept in the runs directory; value: the path the run reads."""
        return [(self.app.shown(str(p)), str(p)) for p in data_form.files(self.runs_dir)]

    def upload(self, file):
        """An uploaded file, kept in `<runs>/data/` and chosen as data.dataset."""
        if not file:
            return gr.skip(), gr.skip()
        try:
            dest = data_form.store(self.runs_dir, file if isinstance(file, str) else file.name)
        except ERRORS as e:
            return gr.skip(), f"**upload refused:** {e}"
        return gr.Dropdown(choices=self.dataset_choices(), value=str(dest)), \
            f"uploaded: `{self.app.shown(str(dest))}`"

    def columns(self, dataset, prompt_col, answer_col):
        """The column mapping dropdowns filled from the dataset's columns (prompt: `prompt` or the first one)."""
        if not dataset:
            return gr.Dropdown(choices=[""], value=""), gr.Dropdown(choices=[forms.AUTO_ANSWER], value=""), ""
        try:
            names = data_form.columns(dataset)
        except ERRORS as e:
            return gr.skip(), gr.skip(), f"**columns:** {self.app.shown(str(e))}"
        prompt = prompt_col if prompt_col in names else "prompt" if "prompt" in names else names[0]
        answer = answer_col if answer_col in names or answer_col == forms.NO_ANSWER else forms.AUTO_ANSWER
        answers = [("found by name (answer, solution)", forms.AUTO_ANSWER), *[(c, c) for c in names],
                   ("none: no gold answer, no verifier", forms.NO_ANSWER)]
        return gr.Dropdown(choices=names, value=prompt), gr.Dropdown(choices=answers, value=answer), \
            f"columns of `{self.app.shown(dataset)}`: {', '.join(f'`{c}`' for c in names)}"

    def preview(self, preset, profile, *rest):
        """One prompt as the run's engine renders it and the verifier's reward for a sample answer."""
        *values, _name, free, sample = rest
        try:
            plan = self._plan(preset, profile, values, free)
            return data_form.preview_text(data_form.preview(plan.config, (sample or "").strip()))
        except ERRORS as e:
            return f"**no preview:** {self.app.shown(str(e))}"

    # ------------------------------------------------------------------ clone

    def clone(self, run):
        """The form filled with a run's settings (and a fresh name), the Launch tab shown; `pending` for the events.
        Outputs: preset, profile, the fields, run name, free overrides, tabs, start message, action message, pending."""
        try:
            self.launcher.run_path(run or "")
            preset, profile, overrides, source = housekeeping.clone(self.runs_dir, run)
            values = forms.form_values(preset, profile)
            kv = [(".".join(k), v) for k, v in map(parse_override, overrides)]
            free = [t for t, (k, _) in zip(overrides, kv) if k not in forms.KEYS]
            values.update({k: v for k, v in kv if k in forms.KEYS})
            values = {k: field_value(k, v) for k, v in values.items()}
            forms.validate(preset, profile, values, " ".join(free))
        except ERRORS as e:
            return (*[gr.skip()] * (len(forms.KEYS) + 6), f"**not cloned:** {self.app.shown(str(e))}", gr.skip())
        pending = {"preset": preset, "profile": profile or "", "values": values}
        return (preset, profile or "", *[values[k] for k in forms.KEYS], "", " ".join(free), gr.Tabs(selected="launch"),
                f"cloned **{run}** ({source}) into the form: change what you like, then Start", "", pending)
