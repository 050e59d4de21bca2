"""Real child processes for the tests of what happens between runs and machines: a training script started with
its output read line by line as it comes (so a test waits for a line, not for a time), a file-size limit standing in
for a full disk (``ulimit -f``), the files a run leaves behind."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tests.helpers.stage_scripts import ROOT

STAGE_B_CONFIG = ROOT / "configs" / "tiny" / "stage_b.yaml"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a training child: this checkout's package first, one thread each (the machine is shared)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            **extra}


def stage_b_command(overrides: list[str]) -> list[str]:
    """``python scripts/train_stage_b.py --config configs/tiny/stage_b.yaml OVERRIDES``."""
    return [sys.executable, str(ROOT / "scripts" / "train_stage_b.py"), "--config", str(STAGE_B_CONFIG), *overrides]


def toy_command(out: Path, steps: int, **kwargs) -> list[str]:
    """``python -m tests.helpers.toy_run OUT STEPS key=value ...`` (values as Python literals)."""
    return [sys.executable, "-m", "tests.helpers.toy_run", str(out), str(steps),
            *(f"{k}={v!r}" for k, v in kwargs.items())]


def file_size_limit(max_bytes: int) -> Callable[[], None]:
    """A ``preexec_fn`` that limits every file the child writes to ``max_bytes`` (``ulimit -f``): a write past it
    fails with EFBIG, as on a full disk. SIGXFSZ, which would kill the child instead, is ignored."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return limit


class Child:
    """A child process whose stdout and stderr (merged) are read as they come, line by line (``\\r`` of a progress
    bar ends a line too), so that a test can wait for a line."""

    def __init__(self, command: list[str], **popen) -> None:
        # Ctrl-C as a terminal's child gets it: a test worker that ignores SIGINT must not pass that on
        popen.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=popen.pop("env", child_env()), cwd=ROOT, **popen)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append(None)  # end of output
            self._changed.notify_all()

    def wait_for(self, needle: str, timeout: float = 300) -> str:
        """The first line holding ``needle``; AssertionError (with the output) if the child ends or ``timeout``
        passes first."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: any(line is None or needle in line for line in self.lines), timeout=timeout)
            hit = next((line for line in self.lines if line is not None and needle in line), None)
        assert found and hit is not None, f"no line with {needle!r}:\n" + self.output()[-3000:]
        return hit

    def finish(self, timeout: float = 300) -> int:
        """Wait for the child and its output; its exit code."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return code

    def output(self) -> str:
        with self._changed:
            return "\n".join(line for line in self.lines if line is not None)


def temp_leftovers(run_dir: Path) -> list[Path]:
    """Temp files or folders in a run directory or its checkpoints folder (``step_N.tmp``, ``.NAME.*.tmp*``)."""
    places = [run_dir, run_dir / "checkpoints"]
    return [p for place in places if place.is_dir() for p in place.iterdir() if ".tmp" in p.name]


def error_lines(text: str) -> list[str]:
    """The lines of ``text`` that start with ``error:``."""
    return [line for line in text.splitlines() if line.startswith("error:")]
