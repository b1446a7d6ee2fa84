"""The launch form: shipped presets, their header comments and profiles, the key fields, and the
one validation (`tinyrl.config.load_config`, exactly as `tinyrl train` does it), so a wrong field
shows the same message, naming the field, as the command line would print.

The form's fields become dotted overrides only where they differ from the preset (+ profile),
so the command the UI runs is the one a user would type. Free overrides come after them and win.

The memory verdict beside the form is the planner's (`tinyrl plan`): the same functions, the same text.
"""

from __future__ import annotations

import functools
import shlex
import sys
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from tinyrl.config import ConfigError, list_presets, load_config, parse_override, read_preset
from tinyrl.plan_report import (
    KNOBS,
    budget_for,
    budget_line,
    maxima_of,
    plan_text,
    prompt_length,
    this_machine,
    verdict_lines,
)
from tinyrl.planner import GPUS, PROFILE_GPUS
from tinyrl.planner.gpus import world_size_of
from tinyrl.planner.memory import size

# (form label, dotted config key); the order is the form's.
FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "model.name"),
    ("task", "data.task"),
    ("steps", "train.steps"),
    ("learning rate", "train.lr"),
    ("group size (completions per prompt)", "rollout.num_generations"),
    ("prompts per step", "train.prompts_per_step"),
    ("recipe", "algo.recipe"),
    ("LoRA r", "lora.r"),
    ("4-bit base (QLoRA)", "model.load_in_4bit"),
    ("max new tokens", "rollout.max_new_tokens"),
    ("dataset (a file in the runs directory's data/, or a hub id)", "data.dataset"),
    ("prompt column", "data.columns.prompt"),
    ("answer column (the verifier's gold)", "data.columns.answer"),
    ("base quantization (int8 / fp8 weight-only)", "model.quantization"),
    ("max staleness (policy versions; 0: synchronous)", "rollout.max_staleness"),
    ("one-step-off (overlap the next batch with the update)", "rollout.overlap"),
    ("agent: streaming episodes", "agent.streaming"),
)
KEYS = tuple(k for _, k in FIELDS)
LABELS = {k: label for label, k in FIELDS}
NUMBERS = ("train.steps", "train.lr", "rollout.num_generations", "train.prompts_per_step", "lora.r",
           "rollout.max_new_tokens", "rollout.max_staleness")  # an empty box is no value: said so, not None
NO_RECIPE = "none"  # the recipe dropdown's entry for algo.recipe: null
AUTO_ANSWER, NO_ANSWER = "", "(none)"  # answer column: found by name (answer, solution); null: no verifier
UI_OWNED = ("log.run_dir", "log.name")  # the UI decides where a run goes (see Launcher.start)
NO_PROFILE = "none (the preset as written)"


def presets() -> list[str]:
    return sorted(list_presets())


def check_preset(name: str) -> str:
    """Only shipped presets come from the page (never a file path)."""
    if name not in list_presets():
        raise ConfigError(f"preset {name!r}: not a shipped preset; choose one of {presets()}")
    return name


def preset_header(name: str) -> str:
    """The comment block a preset opens with (what it trains, memory, hardware, the command)."""
    text = (resources.files("tinyrl.presets") / f"{check_preset(name)}.yaml").read_text()
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" "))
    return "\n".join(lines)


def profiles(name: str) -> list[str]:
    """The preset's hardware profiles (its top-level `profiles:` mapping)."""
    raw = read_preset(check_preset(name))[1].get("profiles") or {}
    return sorted(raw) if isinstance(raw, dict) else []


def profile_choices(name: str) -> list[tuple[str, str]]:
    """The profile dropdown: (shown, value), the preset as written first."""
    return [(NO_PROFILE, "")] + [(p, p) for p in profiles(name)]


def _get(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = obj.get(part, AUTO_ANSWER if part == "answer" else None) if isinstance(obj, dict) else getattr(obj, part)
    return NO_ANSWER if key == "data.columns.answer" and obj is None else obj


def form_values(preset: str, profile: str | None) -> dict[str, object]:
    """The resolved value of each form field for this preset and profile."""
    _, cfg = load_config(check_preset(preset), None, profile or None)
    return {k: _get(cfg, k) for k in KEYS}


def yaml_scalar(value) -> str:
    """A value written so that YAML (how `section.field=value` is read) reads it back unchanged.

    >>> values = (3, 0.001, True, None, "tiny-arith", "true", "1.5")
    >>> [yaml_scalar(v) for v in values]
    ['3', '0.001', 'true', 'null', 'tiny-arith', "'true'", "'1.5'"]
    >>> [yaml.safe_load(yaml_scalar(v)) for v in values] == list(values)
    True
    """
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _norm(key: str, value):
    if key == "algo.recipe" and value in (NO_RECIPE, "", None):
        return None
    if key in ("data.dataset", "data.columns.prompt") and value in ("", None):
        return None
    if key == "data.columns.answer":
        return AUTO_ANSWER if value is None else value
    if isinstance(value, float) and value.is_integer() and key != "train.lr":
        return int(value)  # a gradio Number may hand back 8.0 for 8
    return value


def form_overrides(preset: str, profile: str | None, values: dict[str, object]) -> list[str]:
    """`key=value` for each form field that differs from the preset (+ profile)."""
    base = form_values(preset, profile)
    out = []
    for key in KEYS:
        if key not in values:
            continue
        if key in NUMBERS and values[key] is None:
            raise ConfigError(f"{key} ({LABELS[key]}): the box is empty; type a number (the preset's is {base[key]})")
        v = _norm(key, values[key])
        if v == base[key] or (key == "data.columns.answer" and v == AUTO_ANSWER):
            continue  # (an answer column found by name cannot be asked for over one the preset names)
        out.append(f"{key}={'null' if v == NO_ANSWER else yaml_scalar(v)}")
    return out


def split_overrides(text: str) -> list[str]:
    """Free overrides, one or more per line (shell quoting), each checked like the CLI checks it."""
    try:
        tokens = shlex.split(text or "", comments=True)
    except ValueError as e:
        raise ConfigError(f"overrides: {e} (quote values with spaces: model.name='my model')") from None
    for t in tokens:
        keys, _ = parse_override(t)
        if ".".join(keys) in UI_OWNED:
            raise ConfigError(f"{'.'.join(keys)}: set by the UI (runs go to its runs directory; "
                              f"name a run with the run name field)")
    return tokens


@dataclass
class Plan:
    """A validated launch: the overrides in the order the CLI gets them, and the resolved config."""

    preset: str
    profile: str | None
    overrides: list[str]
    config: object

    def command(self, extra: list[str] = ()) -> list[str]:
        cmd = [sys.executable, "-m", "tinyrl.cli", "train", self.preset, *self.overrides, *extra]
        return cmd + (["--profile", self.profile] if self.profile else [])

    def shown(self) -> str:
        """The command as a user would type it."""
        return shlex.join(["tinyrl", *self.command()[3:]])


def validate(preset: str, profile: str | None, values: dict[str, object], free: str) -> Plan:
    """Build the launch the way `tinyrl train PRESET overrides --profile P` would; ConfigError if bad."""
    profile = profile or None
    overrides = form_overrides(preset, profile, values) + split_overrides(free)
    kv = {".".join(k): v for k, v in map(parse_override, overrides)}  # the CLI's own parsing
    _, cfg = load_config(preset, kv, profile)
    return Plan(preset, profile, overrides, cfg)


def summary(cfg) -> str:
    t, r = cfg.train, cfg.rollout
    return (f"{t.steps} steps × {t.prompts_per_step} prompts × {r.num_generations} completions "
            f"= {t.prompts_per_step * r.num_generations} completions per step; model {cfg.model.name}"
            f"{' (4-bit)' if cfg.model.load_in_4bit else ''}, task {cfg.data.task}, "
            f"recipe {cfg.algo.recipe or 'none'}, LoRA r {cfg.lora.r}")


DETECTED = "detected"  # the card dropdown's value for this process's card (its RAM without one)


@functools.cache
def detected() -> tuple[str, int, str]:
    """(device, bytes, label) of the machine the UI (and the runs it starts) runs on; asked once."""
    return this_machine()


def card_choices() -> list[tuple[str, str]]:
    """The card dropdown: (shown, value) for the detected card, then every card the planner knows."""
    device, total, label = detected()
    here = label.removeprefix("this machine's ") if device == "cuda" else "CPU (RAM)"
    return [(f"detected: {here}, {size(total)}", DETECTED)] + [(f"{g}, {size(b)}", g) for g, b in GPUS.items()]


def card_for_profile(profile: str | None) -> str | None:
    """The card a hardware profile names (24gb -> L4, 8xh100 -> H100), as `tinyrl plan --profile` plans it."""
    return PROFILE_GPUS.get(profile or "")


@dataclass
class MemoryEstimate:
    """The planner's answer for a config on a card, in `tinyrl plan`'s words."""

    summary: str  # the budget, the verdict (peak of budget, fits or not), notes, the largest that fit
    table: str  # the whole plan as `tinyrl plan` prints it ("" when the run could not be planned)
    fits: bool | None  # None: not planned (the summary says why)
    fit: list[str] = field(default_factory=list)  # `key=value` that makes a run that does not fit fit ([]: none)


_PROMPT_LENGTHS: dict[tuple, tuple[int | None, str]] = {}
# Held by whatever in the UI first imports the model stack or loads a tokenizer or model on a worker thread:
# transformers' lazy module is not safe to import from two threads at once ("cannot import name 'AutoModel'").
MODEL_STACK = threading.RLock()


def _prompt_length(cfg) -> tuple[int | None, str]:
    """report.prompt_length, remembered per model and data (it tokenises the run's prompts)."""
    key = (cfg.model.name, cfg.model.gguf_file, repr(cfg.data))
    if key not in _PROMPT_LENGTHS:
        if len(_PROMPT_LENGTHS) >= 64:
            _PROMPT_LENGTHS.clear()
        with MODEL_STACK:  # it loads the model's tokenizer (transformers)
            _PROMPT_LENGTHS[key] = prompt_length(cfg)
    return _PROMPT_LENGTHS[key]


def memory_estimate(cfg, card: str = DETECTED, profile: str | None = None) -> MemoryEstimate:
    """The memory plan of a validated config on `card` (a planner card name, or DETECTED), as
    `tinyrl plan PRESET --gpu CARD [--profile P]` prints it; a profile sets the processes per run.

    A config the planner cannot plan (a model whose config.json it cannot find, a card it does not
    know) gets the planner's own message, as `tinyrl plan` would print it."""
    try:
        device, budget, label = detected() if card in (DETECTED, "", None) else budget_for(cfg, card, None, None)
        tokens, note = _prompt_length(cfg)
        p, table = plan_text(cfg, device, budget, label, world_size_of(profile), tokens, note)
    except ValueError as e:  # ConfigError too: what `tinyrl plan` would print as "tinyrl: error: ..."
        return MemoryEstimate(f"no memory plan: {e}", "", None)
    maxima = maxima_of(p)
    # the largest that fit are each enough alone: the first the planner found (micro-batch first: speed only)
    fit = next(([f"{KNOBS[k]}={v}"] for k, v in maxima.items() if v is not None), []) if not p.fits else []
    return MemoryEstimate("\n".join([budget_line(p), *verdict_lines(p, maxima)]), table, p.fits, fit)


def runs_dir_override(runs_dir: Path, name: str) -> list[str]:
    return [f"log.run_dir={yaml_scalar(str(Path(runs_dir).resolve()))}", f"log.name={yaml_scalar(name)}"]
