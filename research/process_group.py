"""Run a command as its own process group, so that a time limit stops everything it started.

``subprocess.run(..., timeout=...)`` kills only the direct child: a launcher's workers (``accelerate launch`` and
the processes torch's launcher starts under it, or a measurement's own children) would go on holding the GPU while
the next chunk starts. Here the command leads a new session; past its limit the whole group gets SIGTERM, then
SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess

TIMED_OUT = 124  # the exit status reported for a command stopped at its limit (as coreutils' timeout)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # every process of the group has ended
        pass


def run_in_group(argv: list[str], timeout_s: float, grace_s: float = 15.0, **popen) -> int:
    """Run ``argv`` (``popen``: Popen's keyword arguments) for at most ``timeout_s`` seconds; its exit status, or
    :data:`TIMED_OUT` when the limit stopped it and every process of its group."""
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        signal_group(proc.pid, signal.SIGKILL)  # whatever of the group is left, the leader included
        proc.wait()
        return TIMED_OUT
    except BaseException:  # Ctrl-C while waiting: nothing of the group outlives the driver
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
