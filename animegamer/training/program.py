"""A training run as a program: one run per output directory, the temp files of dead runs removed, and Ctrl-C or a
full disk ending in one line that says where the run can go on from.

    @releases_output_dir        on a stage script's ``main``
    build_accelerator(...)      calls :func:`own_output_dir` once the process group exists,
    start_run(...)              and again before the run's first write
    if __name__ == "__main__":
        run_program(main)       a stage script's last line

**One run per output directory.** The process of rank 0 takes :func:`animegamer.io.directory_lock` on
``output_dir`` (an ``flock``: the kernel drops it when the process ends, ``kill -9`` included, so a dead run's lock
is simply taken over): as the run starts if ``output_dir`` exists (a second run into a live run's directory is
refused before it reads anything), else before the run's first write (a run that fails its checks leaves no
directory behind). The other ranks never touch the lock file: rank 0 broadcasts the outcome over the process
group just formed, and every rank of a refused run exits with code 2 (rank 0 prints the one ``error:`` line naming
the holder's PID and command), so no rank waits for a peer that has gone. Holding the lock is what makes it safe to
remove the temp files an earlier, killed run left in ``output_dir`` and ``output_dir/checkpoints``
(``step_N.tmp`` folders, ``.NAME.*.tmp*`` files of the atomic writer): no live run can be writing them.

The lock is released when the run ends, however it ends (:func:`releases_output_dir` on a stage's ``main``), or
when its process does.
"""

from __future__ import annotations

import errno
import functools
import re
import shutil
import signal
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from accelerate.utils import broadcast_object_list
from tqdm import tqdm

from animegamer.cli import fail
from animegamer.io import DirectoryLocked, directory_lock
from animegamer.training.checkpoint import CheckpointWriteError, checkpoint_root, last_checkpoint_note

STALE_DIR = re.compile(r"step_\d+\.tmp|\..+\.tmp")  # save_checkpoint's and write_dir_atomically's temp folders
STALE_FILE = re.compile(r"\..+\.tmp.*")  # animegamer.io.atomic_path's temp files: .<stem>.<random>.tmp<suffix>
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)

_held = ExitStack()  # the lock of the run directory this process holds
_run: dict = {}  # that run's output_dir and whether this process is the one that speaks for it


def own_output_dir(output_dir: str | Path, state, create: bool) -> None:
    """Make this run the only one writing ``output_dir`` (see the module docstring); ``state``: the run's
    ``accelerate.PartialState``, process group formed. Every process calls it, twice: once when the run starts
    (``create=False``: an ``output_dir`` that does not exist yet is left alone, so a run that fails its checks
    leaves nothing behind) and once before the run's first write (``create=True``; a no-op once held). A directory
    another live process holds ends every rank with exit code 2, rank 0 printing one ``error:`` line; so does an
    ``output_dir`` that cannot be made."""
    output_dir = Path(output_dir)
    if _run.get("output_dir") == output_dir and not _run["pending"]:
        return
    release_output_dir()  # this process's previous run, if any
    _run.clear()
    outcome = ["", False]  # (refusal, taken), decided by rank 0 for every rank
    if state.is_main_process and (create or output_dir.is_dir()):
        try:
            _held.enter_context(directory_lock(output_dir, " ".join(sys.argv)))
            remove_stale_temp_files(output_dir)
            outcome = ["", True]
        except DirectoryLocked as exc:
            outcome = [str(exc), False]
        except OSError as exc:
            outcome = [f"output_dir={output_dir}: cannot be used ({exc.strerror or exc})", False]
    if state.num_processes > 1:
        broadcast_object_list(outcome, from_process=0)
    if outcome[0]:
        _held.close()
        if state.is_main_process:
            fail(outcome[0])
        raise SystemExit(2)
    _run.update(output_dir=output_dir, pending=not outcome[1], speaks=state.is_main_process)


def release_output_dir() -> None:
    """Let go of the run directory this process holds (the end of a run); a no-op when it holds none. What the run
    was (its ``output_dir``, for the line that says where it can go on from) stays known."""
    _held.close()
    if _run:
        _run["pending"] = True


def releases_output_dir(main: Callable) -> Callable:
    """Decorate a stage script's ``main``: however it ends (done, an error, a refused input's ``SystemExit``), the
    output directory it held is let go, so a process that goes on after it (a test, a chain of stages calling the
    scripts' ``main``) can start another run into that directory."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        finally:
            release_output_dir()

    return wrapped


def remove_stale_temp_files(output_dir: str | Path) -> list[Path]:
    """Remove the temp files and folders a killed run left in ``output_dir`` and its ``checkpoints`` folder; returns
    what was removed. Call it only while holding the directory's lock. Symbolic links are left alone (we never
    write one)."""
    removed = []
    for folder in (Path(output_dir), checkpoint_root(output_dir)):
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if entry.is_symlink():
                continue
            if entry.is_dir() and STALE_DIR.fullmatch(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
            elif entry.is_file() and STALE_FILE.fullmatch(entry.name):
                entry.unlink(missing_ok=True)
                removed.append(entry)
    if removed:
        print(f"removed {len(removed)} temp file(s) an earlier run left in {output_dir}", file=sys.stderr)
    return removed


def run_program(main: Callable[[], object]) -> None:
    """Run a stage script's ``main`` as a program. Ctrl-C (SIGINT) ends it with one line saying where the last
    complete checkpoint is (exit code 130, no traceback); a full disk or a file-size limit with one ``error:`` line
    saying the same (exit code 1). The checkpoint being written when either happened is removed by
    :func:`animegamer.training.checkpoint.save_checkpoint`; ``latest`` still names the last complete one."""
    try:
        main()
    except KeyboardInterrupt:
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the line below
        try:
            _say(f"interrupted: {_where()}")
        finally:  # a caller that goes on (a test) keeps its Ctrl-C; an ignored SIGINT is inherited by child processes
            signal.signal(signal.SIGINT, before if before is not None else signal.SIG_DFL)
        raise SystemExit(130) from None
    except CheckpointWriteError as exc:
        _say(f"error: {exc}")
        raise SystemExit(1) from None
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        what = f"{exc.filename}:" if exc.filename else "a file of the run"  # a flush names no file
        _say(f"error: {what} could not be written ({exc.strerror}); {_where()}")
        raise SystemExit(1) from None


def _where() -> str:
    if "output_dir" not in _run:
        return "the run had not started"
    return last_checkpoint_note(_run["output_dir"])


def _say(line: str) -> None:
    """Print ``line`` alone on its own last line: progress bars left open by the exception are closed first."""
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
    if _run.get("speaks", True):
        print(line, file=sys.stderr, flush=True)
