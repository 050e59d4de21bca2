"""The one-line description of every config key, for ``--help``: the ``help`` each field of the schemas
(:mod:`animegamer.config.parts`, :mod:`animegamer.config.stages`, ...) is made with (``knob(default, help=...)``), so
the text lives beside the field it describes. A field typed ``Literal[...]`` lists its choices after the text when the
text does not name them all.
"""

from __future__ import annotations

import dataclasses
import functools
import typing


def _choices(hint: object) -> tuple[str, ...]:
    return tuple(str(c) for c in typing.get_args(hint)) if typing.get_origin(hint) is typing.Literal else ()


@functools.cache
def field_descriptions(schema: type) -> dict[str, str]:
    """Field name -> description for the dataclass ``schema`` ('' for a field without a help text)."""
    hints = typing.get_type_hints(schema)
    descriptions = {}
    for f in dataclasses.fields(schema):
        text, choices = f.metadata.get("help", ""), _choices(hints.get(f.name))
        if choices and not all(c in text for c in choices):
            text = f"{text} ({' | '.join(choices)})" if text else " | ".join(choices)
        descriptions[f.name] = text
    return descriptions


def _short(value: object, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


# keys every run config has, whose fields carry no comment of their own
COMMON_KEYS = {
    "kind": "the schema this file is read with (set by the file)",
    "output_dir": "where the run writes its results",
    "seed": "random seed",
}


def config_keys_help(schema: type, prefix: str = "") -> list[tuple[str, str]]:
    """``(key=default, description)`` for every leaf key of ``schema``, nested dataclasses as dotted keys."""
    rows = []
    descriptions = field_descriptions(schema)
    for f in dataclasses.fields(schema):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            rows += config_keys_help(type(default), f"{prefix}{f.name}.")
        else:
            description = descriptions.get(f.name) or (COMMON_KEYS.get(f.name, "") if not prefix else "")
            rows.append((f"{prefix}{f.name}={_short(default)}", description))
    return rows


def config_help(schema: type, width: int = 44) -> str:
    """One line per config key for ``--help``: ``key=default`` and its description (on the next line when the
    key is wider than ``width``)."""
    lines = []
    for key, description in config_keys_help(schema):
        if not description:
            lines.append(f"  {key}")
        elif len(key) < width:
            lines.append(f"  {key:<{width}}{description}")
        else:
            lines.append(f"  {key}\n  {'':<{width}}{description}")
    return "\n".join(lines)
