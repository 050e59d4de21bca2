"""The release stays behind one door: no core module imports animegamer.official (at the top or in a function)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "animegamer"
SATELLITES = ("official", "eval", "bench", "spriteworld")
COMMANDS = ("play.py",)  # python -m animegamer.play: the entry point that picks the parts, above the satellites


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_core_never_imports_official():
    core = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in SATELLITES + COMMANDS]
    assert len(core) > 30  # the walk found the package
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(n for n in _imports(p) if n.startswith("animegamer.official"))
        for p in core
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # and the checker sees a real import where there is one
    assert "animegamer.official.game" in _imports(PACKAGE / "play.py")
