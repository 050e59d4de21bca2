"""Real limits for tests, in real processes: a disk that fills (a file size limit) and a directory another run holds.

    result = run_python(["scripts/prepare_data.py", ...], file_limit=20_000)   # writes past 20 kB fail
    with directory_held(out) as pid:                                           # another process holds `out`
        ...
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_env() -> dict[str, str]:
    """The environment of a child Python that imports this checkout's ``animegamer`` (wherever the venv points)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}


def file_size_limit(limit: int):
    """A ``preexec_fn`` after which no file grows past ``limit`` bytes: the write fails with EFBIG, as one on a full
    disk fails with ENOSPC (SIGXFSZ ignored, so the error is returned instead of the process being killed; ffmpeg
    started by the child inherits both)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a test runner may leave it ignored, which a child inherits
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def run_python(args: list[str], file_limit: int | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in the checkout (text output captured), optionally under :func:`file_size_limit`."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=python_env(),
                          timeout=timeout, preexec_fn=file_size_limit(file_limit) if file_limit is not None else None)


HOLDER = """
import sys
from animegamer.io import directory_lock
with directory_lock(sys.argv[1], "python other_run.py --holding"):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


@contextmanager
def directory_held(directory: str | Path) -> Iterator[int]:
    """Another live process holds ``animegamer.io.directory_lock(directory)`` while the block runs; yields its PID.
    The block starts only once the holder says it holds the lock (no sleeping on a guess)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env=python_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
