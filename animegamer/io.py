"""Atomic file writes (everything the project saves goes through a temp file and a rename) and checkpoint paths.

A file written here is either the old one or the complete new one, even across a crash or a power cut: the temp
file is flushed to disk (fsync) before the rename, and the directory after it, so the rename itself is durable.
New files get the mode any normal writer would give them (0666 minus the process umask), not the 0600 a temp file
is created with.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import stat
import time
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
    tmp = None
    try:
        # The temp name is known before the file exists, so an interrupt (Ctrl-C raises KeyboardInterrupt at any
        # bytecode) that lands just after the file is created still finds it in ``finally``; mkstemp returns the
        # name only after creating the file, which left an orphan when the interrupt came in between.
        for _ in range(100):
            tmp = path.parent / f".{path.stem}.{_temp_token()}.tmp{path.suffix}"
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                break
            except FileExistsError:
                tmp = None
        else:
            raise FileExistsError(f"no free temp name beside {path}")
        yield tmp
        os.chmod(tmp, mode if mode is not None else 0o666 & ~current_umask())
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


_TOKEN_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789_"


def _temp_token() -> str:
    """Eight random letters for a temp name (the alphabet and length ``remove_stale_temps`` recognises)."""
    return "".join(secrets.choice(_TOKEN_LETTERS) for _ in range(8))


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
    raw = read_json_bounded(path)
    if not isinstance(raw, dict) or raw.get("format") != fmt:
        raise ValueError(f"{path}: not {what} (format {fmt!r} expected)")
    return raw


MAX_RECORD_BYTES = 16 << 20  # a JSON record or config we read (the largest we write is a few kB)


class LongNumber:
    """An integer of more than ``LongNumber.DIGITS`` digits in untrusted JSON: kept as its length, never converted
    (Python refuses past 4300 digits, with a message that names no file), so a field check names the field."""

    DIGITS = 40

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"a number of {self.digits} digits"


def parse_json(text: str) -> Any:
    """``json.loads`` for untrusted text: integers past ``LongNumber.DIGITS`` digits become :class:`LongNumber`."""
    return json.loads(text, parse_int=lambda digits: int(digits) if len(digits) <= LongNumber.DIGITS
                      else LongNumber(len(digits.lstrip("-"))))


def read_json_bounded(path: str | Path, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """An untrusted JSON file (:func:`read_text_bounded`, :func:`parse_json`): its value, or a one-line
    ``ValueError`` naming it (not a regular file, too big, not UTF-8, not JSON). A missing file is
    ``FileNotFoundError``."""
    text = read_text_bounded(path, max_bytes)
    try:
        return parse_json(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "nested too deep"
        raise ValueError(f"{path}: not valid JSON ({reason})") from None


def iter_jsonl(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for every non-blank line; a bad line raises ``error`` naming file:line. A path
    that is not a regular file is refused before it is opened (:func:`check_regular_file`)."""
    try:
        check_regular_file(path)
    except ValueError as exc:
        raise error(str(exc)) from None
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield number, parse_json(line)
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


def write_cause(exc: BaseException) -> str:
    """Why a file could not be written, in words: ``File too large`` rather than safetensors' ``Error while
    serializing: I/O error: File too large (os error 27)`` (safetensors raises its own error, not an OSError)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split())
    found = re.search(r"I/O error: (.*?)(?: \(os error \d+\))?$", text)
    return found.group(1) if found else text[:300]


# ---------------------------------------------------------------- reading files we did not write

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def check_regular_file(path: str | Path, max_bytes: int | None = None) -> os.stat_result:
    """``path``'s stat (links followed) if it is a regular file of at most ``max_bytes``; otherwise a one-line
    ``ValueError`` naming it. Call it before opening a file a user gave us: opening a named pipe blocks forever and a
    device reads without end. A missing file is ``FileNotFoundError``; a link loop is a ``ValueError``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except OSError as exc:  # ELOOP (a link to itself), ENAMETOOLONG, EACCES ...
        raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise ValueError(f"{path}: is {kind}, not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise ValueError(f"{path}: {st.st_size:,} bytes, more than the {max_bytes:,} allowed for it")
    return st


def read_bytes_bounded(path: str | Path, max_bytes: int) -> bytes:
    """A regular file's bytes, refused (``ValueError``, one line) past ``max_bytes`` or when it is not a regular file.
    The size is checked before and while reading (a file may grow between the two)."""
    check_regular_file(path, max_bytes)
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: more than the {max_bytes:,} bytes allowed for it")
    return data


def read_text_bounded(path: str | Path, max_bytes: int) -> str:
    """``read_bytes_bounded`` decoded as UTF-8; undecodable bytes are a one-line ``ValueError``."""
    try:
        return read_bytes_bounded(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None


# ---------------------------------------------------------------- one run per directory

LOCK_NAME = ".animegamer.lock"


class DirectoryLocked(RuntimeError):
    """Another live process holds the directory (the message names its PID and command)."""


def _open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created with the umask's mode, never through a link) to flock."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666 & ~current_umask())


@contextmanager
def directory_lock(directory: str | Path, command: str) -> Iterator[Path]:
    """Hold ``directory`` for this process while the block runs; a second holder is refused with
    ``DirectoryLocked`` naming the first one's PID and command.

    The lock is an ``flock`` on ``directory/.animegamer.lock``: the kernel drops it when its process ends, however it
    ends (``kill -9`` included), so a lock left by a dead process is simply taken over. The file stays (removing a
    locked file races with the next taker); it holds the last holder's PID, command and start time for the message.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = _open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace")
            try:
                info = json.loads(holder)
                who = f"PID {int(info['pid'])} ({str(info['command'])[:200]!r}, since {info['started']})"
            except (ValueError, KeyError, TypeError):
                who = "another process"
            raise DirectoryLocked(f"{directory} is in use by {who}; wait for it to end or use another directory") \
                from None
        record = json.dumps({"pid": os.getpid(), "command": command,
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def update_json(path: str | Path, key: str, value: Any) -> dict:
    """Set ``key`` of the JSON object at ``path`` to ``value`` (the file is created when missing) and return the
    object written. Processes updating one file side by side each keep their key: the read and the atomic write
    happen under a blocking ``flock`` on ``<path>.lock``, so none writes back an object read before another's
    update. A file that is not a JSON object raises ``ValueError``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock_file(path.with_name(path.name + ".lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = parse_json(path.read_text()) if path.is_file() else {}
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds {type(data).__name__}, not a JSON object")
        data[key] = value
        atomic_write_json(path, data)
        return data
    finally:
        os.close(fd)


def remove_stale_temps(directory: str | Path, depth: int = 0) -> list[Path]:
    """Remove the temp files ``atomic_path`` leaves when its process is killed (``.<name>.<random>.tmp<suffix>``)
    from ``directory`` and, ``depth`` levels down, its subdirectories (links are never followed); returns them.

    Only safe while this process holds ``directory_lock(directory)``: another run's temp file is a file being
    written."""
    removed: list[Path] = []
    folder = Path(directory)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if depth > 0:
                removed += remove_stale_temps(entry.path, depth - 1)
        elif _STALE_TEMP.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


_STALE_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp(\.[^/]*)?")  # atomic_path's temp names


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
