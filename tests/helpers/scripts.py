"""Programs under scripts/ and research/ loaded as modules, so that a test calls their ``main`` and helpers in
this process (they are folders of programs, not packages; the package never loads them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str | Path) -> ModuleType:
    """A script file as a module, so that a chain of steps or a test calls its ``main`` and helpers in-process.

    ``scripts/`` and ``research/`` are folders of programs, not packages: ``load_script("scripts/benchmark.py")``
    (relative to the checkout, or an absolute path; the ``.py`` may be left out). The module is named after the
    file and executed fresh on every call.
    """
    path = Path(path)
    path = path if path.suffix == ".py" else path.with_name(path.name + ".py")
    path = path if path.is_absolute() else REPO_ROOT / path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise FileNotFoundError(f"{path}: no such script")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
