"""research/gpu_lease.py's run_in_group: a measurement stopped at its time limit takes every process it started
with it (a launcher's GPU workers must not outlive their chunk)."""

import signal
import subprocess
import sys
import time
from pathlib import Path

from research.gpu_lease import TIMED_OUT, run_in_group


def alive(pid: int) -> bool:
    """A process that exists and has not ended (a zombie left to a parent that never reaps counts as ended)."""
    status = Path(f"/proc/{pid}/status")
    try:
        state = next(line for line in status.read_text().splitlines() if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "zombie" not in state and "(dead)" not in state


def test_exit_status_passes_through():
    assert run_in_group([sys.executable, "-c", "raise SystemExit(3)"], 60) == 3


def test_past_its_limit_the_command_and_its_children_are_stopped_even_if_they_ignore_sigterm(tmp_path):
    pids = tmp_path / "pids"
    child = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
             f"open({str(pids)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    started = time.monotonic()
    rc = run_in_group([sys.executable, "-c", child], timeout_s=8, grace_s=1, stdout=subprocess.DEVNULL)
    assert rc == TIMED_OUT and time.monotonic() - started < 60
    grandchild = int(pids.read_text())
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # the child's handler stayed in the child
