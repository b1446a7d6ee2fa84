"""Prompt templates: a format string that may name a row's columns, and nothing else.

`data.prompt_template: "{question} Answer with a number."` (and a task's own template argument, such as the
code task's `data.task_args.prompt`) is filled with one row's columns. Python's `str.format` would also
follow attributes and indexes (`{question.__class__.__mro__}` renders interpreter internals into every prompt;
`{question[__class__]}` raises) and take any width (`{question:>2000000000}` allocates gigabytes). Here a
template is checked once, when the config is read (`check_template`: plain column names, a short format
spec, literal braces doubled), and filled by `render` with the names checked against the row's columns.

    >>> render("{q} = ?", {"q": "2+2"}, "data.prompt_template")
    '2+2 = ?'
    >>> check_template("{q.__class__}", "data.prompt_template")
    Traceback (most recent call last):
    ...
    tinyrl.errors.ConfigError: data.prompt_template: may name a row's columns only ({question}), not attributes or items: '{q.__class__}'
"""

from __future__ import annotations

import re
import string

from tinyrl.errors import ConfigError

MAX_TEMPLATE_CHARS = 20_000  # a prompt template, not a document
MAX_WIDTH = 1_000  # the largest width or precision a format spec may ask for
_SPEC = re.compile(r"^(?:.?[<>=^])?[+\- ]?#?0?(\d*)[,_]?(?:\.(\d+))?[a-zA-Z%]?$")  # the format-spec mini-language


def fields(template: str, where: str) -> list[str]:
    """The column names `template` uses, in order; ConfigError (naming `where`) for anything but plain names with
    a short format spec: attributes, items, positional fields, nested fields, conversions, huge widths."""
    if not isinstance(template, str):
        raise ConfigError(f"{where}: must be a format string over a row's columns, got {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ConfigError(f"{where}: {len(template)} characters; a template holds at most {MAX_TEMPLATE_CHARS}")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(f"{where}: not a format string ({e}); double literal braces: \\boxed{{{{}}}}") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            what = "attributes or items" if any(c in name for c in ".[") else "positional or empty fields"
            raise ConfigError(f"{where}: may name a row's columns only ({{question}}), not {what}: '{{{name}}}'")
        if conversion is not None or "{" in (spec or ""):
            raise ConfigError(f"{where}: {{{name}}} has a conversion or a nested field; name the column alone")
        m = _SPEC.match(spec or "")
        if m is None or any(int(g) > MAX_WIDTH for g in m.groups() if g):
            raise ConfigError(f"{where}: {{{name}:{spec}}} is not a short format spec (width and precision at most "
                              f"{MAX_WIDTH})")
        names.append(name)
    return names


def check_template(template: str, where: str) -> None:
    """ConfigError naming `where` unless `template` is one `render` fills (see the module docstring)."""
    fields(template, where)


def render(template: str, row: dict, where: str) -> str:
    """`template` filled with `row`'s columns; ConfigError naming a column the row lacks and those it has."""
    names = fields(template, where)
    missing = [n for n in names if n not in row]
    if missing:
        raise ConfigError(f"{where}: names column {missing[0]!r}, which the rows lack; they have {sorted(row)}")
    try:
        return template.format_map({n: row[n] for n in names})
    except (ValueError, TypeError) as e:  # a spec that does not fit the value's type ({n:d} of a string)
        raise ConfigError(f"{where}: cannot fill it from a row ({e})") from None
