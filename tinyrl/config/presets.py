"""Presets and their layers: YAML files, `base:` inheritance, hardware profiles, dotted overrides
and algorithm recipes, merged into one YAML-shaped dict (`preset_layers`).

Shipped presets live in `tinyrl.presets` (the repo's presets/ folder, inside the wheel); a
preset may also be a YAML path. Nothing here builds or validates a RunConfig: that is
`tinyrl.config.resolve`.
"""

from __future__ import annotations

import difflib
import logging
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tinyrl.algo.recipes import RECIPES
from tinyrl.errors import ConfigError

DEFAULT_PRESET = "tiny_grpo_cpu"
log = logging.getLogger("tinyrl.config")


def _preset_dir():
    return resources.files("tinyrl.presets")


class _Loader(yaml.SafeLoader):
    """SafeLoader that warns when one mapping gives a key twice (plain YAML keeps the last, silently)."""

    source = "YAML"

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key, line = self.construct_scalar(key_node), key_node.start_mark.line + 1
                if key in seen:
                    log.warning("%s, line %d: key %r is given twice (first on line %d); the later value wins",
                                self.source, line, key, seen[key])
                seen.setdefault(key, line)
        return super().construct_mapping(node, deep)


MAX_YAML_NODES = 100_000  # values in one document, counting each use of an alias (a config holds hundreds)
MAX_YAML_DEPTH = 32  # nesting (a config is 3 deep: section, field, a list or mapping value)


def load_yaml(text: str, source: str):
    """`yaml.safe_load`, warning about duplicate keys; a YAML error becomes a ConfigError naming `source` and the line.
    A document whose values, aliases expanded, exceed MAX_YAML_NODES (an alias bomb) or nest deeper than
    MAX_YAML_DEPTH is refused before anything is built from it."""
    loader = _Loader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        _check_size(node, source)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}{where}: not valid YAML ({what})") from None
    except RecursionError:  # the YAML composer recurses once per level
        raise ConfigError(f"{source}: nested too deeply (a config nests {MAX_YAML_DEPTH} levels at most)") from None
    finally:
        loader.dispose()


def _check_size(node, source: str) -> None:
    """ConfigError when the composed document expands to too many values or nests too deep (iterative: an
    alias is walked each time it is used, so a bomb is counted as what it would build, and cut off early)."""
    stack, seen = [(node, 1)] if node is not None else [], 0
    while stack:
        n, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise ConfigError(f"{source}: too large: more than {MAX_YAML_NODES} values once its aliases are expanded "
                              f"(a YAML alias bomb?)")
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{source}: nested too deeply (a config nests {MAX_YAML_DEPTH} levels at most)")
        if isinstance(n, yaml.SequenceNode):
            stack += [(c, depth + 1) for c in n.value]
        elif isinstance(n, yaml.MappingNode):
            stack += [(c, depth + 1) for kv in n.value for c in kv]


def _read_preset_file(entry, label: str) -> dict:
    """The mapping in a preset file; ConfigError for unreadable, binary, malformed, empty or non-mapping files."""
    try:
        text = entry.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"preset {label}: not a text file (not UTF-8); a preset is a YAML mapping of sections") from None
    except OSError as e:
        raise ConfigError(f"preset {label}: cannot read it ({e.strerror or e})") from None
    data = load_yaml(text, f"preset {label}")
    if data is None:
        raise ConfigError(f"preset {label} is empty: it sets nothing. Put sections in it (model:, train:, ...), "
                          f"or run `tinyrl train` with no preset to train the default")
    if not isinstance(data, dict):
        raise ConfigError(f"preset {label}: must be a mapping of sections (model:, train:, ...), "
                          f"got a value of type {type(data).__name__}")
    return data


def list_presets() -> dict[str, str]:
    """Shipped preset names -> their one-line description."""
    out = {}
    for entry in sorted(_preset_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            try:
                raw = _read_preset_file(entry, entry.name)
            except ConfigError as e:
                out[entry.name[:-5]] = f"(cannot be read: {e})"
                continue
            out[entry.name[:-5]] = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
    return out


def read_preset(preset: str | Path | None, _chain: tuple[str, ...] = ()) -> tuple[str, dict]:
    """Return (name, raw dict) of a shipped preset name or a YAML file path.

    `base: OTHER` (a shipped name, or a YAML path relative to this file) starts from OTHER's
    fields: mappings merge key by key (profiles too), any other value replaces the base's. A chain of
    bases that comes back to a preset it passed (the same file, or the same shipped preset) is refused;
    a local file may take a shipped preset of the same name as its base."""
    preset = DEFAULT_PRESET if preset is None else str(preset)
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        if not path.resolve().is_file():
            raise ConfigError(f"preset {preset!r}: not a regular file")
        name, data, here, key = path.stem, _read_preset_file(path, str(path)), path.parent, str(path.resolve())
    else:
        name = preset[:-5] if preset.endswith(".yaml") else preset
        entry = _preset_dir() / f"{name}.yaml"
        if not entry.is_file():
            if path.is_file():
                raise ConfigError(f"preset {preset!r}: a preset file's name must end in .yaml or .yml")
            known = sorted(list_presets())
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"preset {preset!r} is neither a shipped preset nor a YAML file.{hint} "
                f"Shipped presets: {known} (see `tinyrl presets`)."
            )
        data, here, key = _read_preset_file(entry, name), None, f"shipped preset {name}"
    if key in _chain:
        raise ConfigError(f"preset {name!r}: its base leads back to itself ({' -> '.join(_chain + (key,))})")
    base = data.pop("base", None)
    if base is None:
        return name, data
    if not isinstance(base, str):
        raise ConfigError(f"preset {name!r}: base must name a preset (shipped name or YAML path), got {base!r}")
    if here is not None and base.endswith((".yaml", ".yml")) and (here / base).is_file():
        base = str(here / base)
    return name, _merged(read_preset(base, _chain + (key,))[1], data)


def _merged(under: dict, over: dict) -> dict:
    """`over` on top of `under`: mappings merge key by key, any other value replaces."""
    out = dict(under)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.lr=1e-5` -> (["train", "lr"], 1e-5). Values are read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value, e.g. train.lr=1e-5")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override {text!r}: empty field name in {key!r}")
    return keys, load_yaml(raw, f"override {text!r}") if raw.strip() else ""


def apply_overrides(data: dict, overrides: dict[str, Any] | list[str]) -> dict:
    """Apply one layer of dotted overrides (["a.b=1"] or {"a.b": 1}) to a nested dict, in place.

    A layer that names `algo.recipe` first sets that recipe's switches over whatever earlier
    layers set; the layer's other fields then win over the recipe (see `resolve_recipe`)."""
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else [
        (k.split("."), v) for k, v in overrides.items()
    ]
    for keys, value in sorted(items, key=lambda kv: kv[0] != ["algo", "recipe"]):  # the recipe first
        node = data
        for i, k in enumerate(keys[:-1]):
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{'.'.join(keys[: i + 1])}: is a value, not a section; cannot set {'.'.join(keys)}")
            node = nxt
        node[keys[-1]] = value
        if keys == ["algo", "recipe"] and value is not None:
            data["algo"] = {**node, **resolve_recipe(value)}
    return data


def _profile_fields(name: str, profile) -> dict[str, Any]:
    """A profile as dotted fields: `{section: {field: value}}` and `{"section.field": value}` alike.

    Only the section level is opened: a field whose value is a mapping (data.task_args) is
    replaced as a whole, as it is by an override. (Issue 15 owns the profiles mechanism; this
    is the reading the shipped GPU presets rely on.)"""
    if not isinstance(profile, dict):
        raise ConfigError(f"profile {name!r}: must be a mapping of sections (train: {{...}}) or dotted "
                          f"fields (train.lr: ...), got {type(profile).__name__}")
    out: dict[str, Any] = {}
    for key, value in profile.items():
        if "." not in str(key) and isinstance(value, dict):
            out.update({f"{key}.{field}": v for field, v in value.items()})
        else:
            out[str(key)] = value
    return out


def preset_layers(preset: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None,
                  profile: str | None = None) -> tuple[str, dict]:
    """(name, the YAML-shaped dict) of a preset with a hardware profile and dotted overrides applied.

    Three layers, each over the one before: the preset, its `profiles[profile]`, the overrides.
    `tinyrl.config.resolve` builds and validates the result."""
    name, data = read_preset(preset)
    if isinstance(data.get("algo"), dict):
        data["algo"] = apply_recipe(data["algo"])  # the preset's own recipe, under its own fields
    profiles = data.pop("profiles", {}) or {}
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise ConfigError(f"profiles: must map profile names to sections of fields (e.g. 8xh100: {{train: "
                          f"{{prompts_per_step: 64}}}}), got {profiles!r:.80}")
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"--profile {profile!r}: this preset defines {sorted(profiles) or 'no profiles'}")
        apply_overrides(data, _profile_fields(profile, profiles[profile]))  # field by field: the base's other fields stay
    if overrides:
        apply_overrides(data, overrides)
    return name, data


def resolve_recipe(name: Any, path: str = "algo.recipe") -> dict:
    """The switches a named recipe sets (tinyrl/algo/recipes.py).

    Precedence, from weakest: AlgoConfig's defaults < a layer's recipe < the fields set in that
    same layer < later layers. The layers are the preset, the `--profile`, the command line (each
    may name a recipe). So `tinyrl train algo.recipe=rloo` on a preset that sets `estimator: grpo`
    runs RLOO, while a preset that names `recipe: dapo` and sets `epsilon_high: 0.3` keeps its 0.3."""
    if not isinstance(name, str) or name not in RECIPES:
        raise ConfigError(f"{path}: must be one of {sorted(RECIPES)}, got {name!r:.80}")
    return {**RECIPES[name], "recipe": name}


def apply_recipe(algo: dict, path: str = "algo.recipe") -> dict:
    """One layer's algo section: its recipe's switches, with the layer's own fields over them."""
    return {**resolve_recipe(algo.get("recipe"), path), **algo} if algo.get("recipe") is not None else dict(algo)
