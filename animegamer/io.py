"""Atomic file writes (everything the project saves goes through a temp file and a rename) and checkpoint paths.

A file written here is either the old one or the complete new one, even across a crash or a power cut: the temp
file is flushed to disk (fsync) before the rename, and the directory after it, so the rename itself is durable.
New files get the mode any normal writer would give them (0666 minus the process umask), not mkstemp's 0600.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (``os.umask`` can only set it, and setting
    it twice races with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_path(path: str | Path) -> None:
    """Flush a file's or a directory's contents to disk (a directory: its entries, e.g. a rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, mode: int | None = None) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it is made durable and renamed over ``path``, on error removed.

    The caller writes the temp path however it likes (it exists, empty). Before the rename it gets ``mode`` (default:
    the umask's mode) and is fsynced; after the rename the directory is fsynced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode if mode is not None else 0o666 & ~current_umask())
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_format_json(path: Path, fmt: str, what: str) -> dict:
    """An untrusted JSON record whose ``format`` key must be ``fmt``: the dict, or a one-line ValueError
    (``what`` names the kind of file in the message)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != fmt:
        raise ValueError(f"{path}: not {what} (format {fmt!r} expected)")
    return raw


def iter_jsonl(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for every non-blank line; a bad line raises ``error`` naming file:line."""
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number}: not valid JSON ({exc.msg})") from None


def path_inside(root: str | Path, path: str | Path) -> Path:
    """``path`` (relative paths are taken from ``root``) resolved with every symlink followed, if it lies inside
    ``root`` (resolved the same way); otherwise ``ValueError``. For paths read from files a user may not have made."""
    base = Path(root).resolve()
    resolved = (base / path).resolve()
    if not resolved.is_relative_to(base):
        raise ValueError(f"{path} is outside {root}")
    return resolved


# ---------------------------------------------------------------- checkpoint paths

STEP_PREFIX = "step_"
STEP_DIR = re.compile(rf"{STEP_PREFIX}\d+")  # a complete checkpoint of a run: <output_dir>/checkpoints/step_N
DECODER_DIR = "decoder"  # a checkpoint's trained decoder parts (stages a, c, d)


def _latest_step_dir(latest: Path) -> Path:
    """The step directory a ``latest`` file names: a bare ``step_X`` beside it, never a path elsewhere (a
    checkpoint folder may come from someone else)."""
    name = latest.read_text(errors="replace").strip()
    if not STEP_DIR.fullmatch(name):
        raise FileNotFoundError(f"checkpoint not found: {latest} names {name[:60]!r}, not a {STEP_PREFIX}N directory")
    return latest.parent / name


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a path that may be a run dir, its ``checkpoints/latest`` file, or a step dir."""
    path = Path(path)
    if path.is_file() and path.name == "latest":
        path = _latest_step_dir(path)
    elif (path / "checkpoints" / "latest").is_file():
        path = _latest_step_dir(path / "checkpoints" / "latest")
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def checkpoint_decoder_dir(checkpoint: str | Path) -> Path:
    """The directory holding a checkpoint's trained decoder parts (``decoder/`` of a step dir, or the dir itself)."""
    path = resolve_checkpoint(checkpoint)
    return path / DECODER_DIR if (path / DECODER_DIR).is_dir() else path
