"""The one-line description of every config key, read from the ``# comment`` beside its field in the
schemas (:mod:`animegamer.config.parts`, :mod:`animegamer.config.runs`).

The dataclasses in :mod:`animegamer.config` document each field with a trailing comment; that comment is the
single source of the text ``--help`` shows, so the two cannot drift apart. A field's description is:

- its trailing comment (every line of a field that spans several lines),
- continued by the comment lines right below it when the trailing comment ends mid-sentence (``,`` ``|`` ``(``...),
- otherwise a comment block right above a field describes that field and the uncommented fields right below it
  (up to a blank line).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import tokenize

_CONTINUES = (",", "|", "(", "{", "[", ";", ":", "-", "+", "=")


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line number (1-based) -> (comment text, whether the line holds nothing but the comment)."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            found[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    return found


@functools.cache
def field_descriptions(schema: type) -> dict[str, str]:
    """Field name -> description for the dataclass ``schema`` ('' for a field without a comment)."""
    try:
        source = inspect.getsource(schema)
    except (OSError, TypeError):  # a class built at run time has no source
        return {}
    comments = _comments(source)
    body = ast.parse(source).body[0].body  # the class statement's body
    fields = [(n.target.id, n.lineno, n.end_lineno) for n in body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    descriptions: dict[str, str] = {}
    leading: list[str] = []  # a comment block not yet attached
    previous: str | None = None  # the field just above, while only its continuation comments follow it
    shared = ""  # a leading block also describes the uncommented fields right below its first one
    line, last_line = 1, len(source.splitlines())
    for name, start, end in fields + [(None, last_line + 1, last_line)]:
        for number in range(line, start):  # lines between two fields
            text, alone = comments.get(number, ("", False))
            if not alone:  # a blank or code line ends every block
                leading, previous, shared = [], None, ""
            elif previous and descriptions[previous].endswith(_CONTINUES):
                descriptions[previous] += " " + text
            else:
                leading.append(text)
                previous, shared = None, ""
        if name is None:
            break
        trailing = [comments[n][0] for n in range(start, end + 1) if n in comments and not comments[n][1]]
        descriptions[name] = " ".join(trailing) or " ".join(leading) or shared
        shared = "" if trailing else descriptions[name]
        leading, previous, line = [], name, end + 1
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
