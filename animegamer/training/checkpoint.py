"""Checkpoints that make a run resumable exactly and rebuildable from its directory.

    output_dir/checkpoints/step_0000200/
        <model parts>          written by the stage's ``save_weights(dir)`` (safetensors + adapter configs)
        optimizer.bin, scheduler.bin, random_states_<rank>.pkl ...   accelerate's state (RNG of every process)
        trainer_state.json     step, samples seen, last losses
    output_dir/checkpoints/latest   text file naming the newest complete checkpoint

A checkpoint is written to ``step_X.tmp``, fsynced, and renamed when complete, so a crash never leaves a half
checkpoint that ``--resume latest`` would pick up; re-saving an existing step swaps the new directory in (an atomic
exchange on Linux), so ``latest`` never names a missing or partial directory. A write that fails (a full disk, a
file-size limit, Ctrl-C) removes ``step_X.tmp``; a full disk is :class:`CheckpointWriteError`, one line naming the
checkpoint ``latest`` still names. Every published file gets the usual mode (0666 minus the umask; safetensors
itself writes 0600). Only trained parameters are saved: accelerate's own model saving is switched off by
:func:`skip_model_weights_in_state`.

A resume is checked before anything is built or written (:func:`check_resume`): every weights and state file must
be complete, and every process's RNG state must load (safely: no pickled code runs) or the resume would not be
exact; ``train.allow_rng_reset=true`` accepts a missing one, and the run records that it did. Every file of the
checkpoint must be a regular file before any is opened (a named pipe would block the resume forever, a device read
without end).
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError

from animegamer.io import (
    STEP_DIR,
    STEP_PREFIX,
    atomic_write_json,
    atomic_write_text,
    check_regular_file,
    current_umask,
    fsync_path,
    read_text_bounded,
    resolve_checkpoint,
)
from animegamer.models.weights import DamagedFileError, check_safetensors

RNG_FILE = "random_states_{rank}.pkl"  # accelerate's name for one process's RNG state
RNG_KEYS = ("random_state", "numpy_random_seed", "torch_manual_seed")
MAX_STATE_BYTES = 1 << 20  # trainer_state.json: a step and a few losses

# what a write on a full disk or past a file-size limit raises: OSError (ENOSPC, EFBIG) from Python's own writes,
# RuntimeError from torch.save ("unexpected pos ..."), SafetensorError from safetensors
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and what is wrong with it."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint that could not be written (a full disk, a file-size limit); nothing of it was published and the
    message names the checkpoint ``latest`` still names."""


@dataclass
class ResumePoint:
    """A checked checkpoint to resume from."""

    path: Path
    step: int
    rng_reset: str = ""  # why some process's RNG cannot be restored ("" when every one can)
    recipe_changes: dict = field(default_factory=dict)  # key: {"was": recorded, "now": this run's} (allowed changes)


def skip_model_weights_in_state(accelerator) -> None:
    """Make ``save_state``/``load_state`` handle optimizer, scheduler and RNG only; weights are ours to save."""

    def on_save(models, weights, output_dir):
        weights.clear()

    def on_load(models, input_dir):
        models.clear()

    accelerator.register_save_state_pre_hook(on_save)
    accelerator.register_load_state_pre_hook(on_load)


def _engine_kwargs(accelerator, saving: bool) -> dict:
    """DeepSpeed saves its engine's module itself: keep frozen (pretrained) weights out of the checkpoint."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return {}
    return {"exclude_frozen_parameters": True} if saving else {"load_module_strict": False}


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and STEP_DIR.fullmatch(p.name)]  # not step_X.tmp / .old
    return sorted(done, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def find_resume(output_dir: str | Path, resume: str) -> Path | None:
    """The checkpoint to resume from: ``""`` none, ``latest`` the newest in output_dir (None if there is none)."""
    if not resume:
        return None
    if resume == "latest":
        found = list_checkpoints(output_dir)
        return found[-1] if found else None
    return resolve_checkpoint(resume)


def fsync_tree(path: Path) -> None:
    """Flush every file and directory under ``path`` to disk, so a rename that publishes it cannot outrun its data."""
    for parent, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(Path(parent) / name)
        fsync_path(parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the OS or the file
    system has no such call."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def usual_modes(path: Path) -> None:
    """Give every file under ``path`` mode 0666 and every directory 0777, minus the umask, as ``open`` and ``mkdir``
    would: some writers (safetensors, and peft through it) create their files 0600, readable by their owner only."""
    mask = current_umask()
    for parent, dirs, files in os.walk(path):
        for name in files:
            if not os.path.islink(os.path.join(parent, name)):
                os.chmod(os.path.join(parent, name), 0o666 & ~mask)
        for name in dirs:
            if not os.path.islink(os.path.join(parent, name)):
                os.chmod(os.path.join(parent, name), 0o777 & ~mask)
    os.chmod(path, 0o777 & ~mask)


def replace_dir(new: Path, final: Path) -> None:
    """Publish the complete directory ``new`` as ``final``: given the usual modes, fsynced, then renamed in. An
    existing ``final`` is swapped out atomically and then deleted, so ``final`` always names a complete directory
    (where no atomic exchange exists, the old one is renamed aside first: a crash between the two renames leaves it
    as ``<final>.old``)."""
    new, final = Path(new), Path(final)
    usual_modes(new)
    fsync_tree(new)
    if not final.exists():
        new.rename(final)
    elif _exchange(new, final):
        shutil.rmtree(new)  # it now holds the old contents
    else:
        aside = final.with_name(final.name + ".old")
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
        new.rename(final)
        shutil.rmtree(aside)
    fsync_path(final.parent)


def write_dir_atomically(final: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a fresh temp directory beside ``final``, then :func:`replace_dir` it in. If ``write``
    fails, ``final`` is untouched and the temp directory removed."""
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        replace_dir(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def save_checkpoint(
    accelerator,
    output_dir: str | Path,
    step: int,
    save_weights: Callable[[Path], None],
    trainer_state: dict,
    keep: int = 3,
) -> Path:
    """Write a complete checkpoint for optimizer step ``step``; prune to the newest ``keep``.

    A write that fails (any exception, Ctrl-C included) leaves no ``step_X.tmp`` behind and ``latest`` as it was; a
    full disk or a file-size limit raises :class:`CheckpointWriteError`."""
    root = checkpoint_root(output_dir)
    final = root / f"{STEP_PREFIX}{step:07d}"
    tmp = root / f"{final.name}.tmp"
    try:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp), **_engine_kwargs(accelerator, saving=True))
        accelerator.wait_for_everyone()  # every rank's RNG file is in tmp before it is renamed
        if accelerator.is_main_process:
            save_weights(tmp)
            atomic_write_json(tmp / "trainer_state.json", {"step": step, **trainer_state})
            replace_dir(tmp, final)
            atomic_write_text(root / "latest", final.name + "\n")  # fsynced, and its directory too
            if keep > 0:
                for old in list_checkpoints(output_dir)[:-keep]:
                    shutil.rmtree(old, ignore_errors=True)
    except WRITE_ERRORS as exc:
        raise CheckpointWriteError(
            f"the checkpoint of step {step} could not be written in {root} ({_first_line(exc)}); "
            f"{last_checkpoint_note(output_dir)}"
        ) from None
    finally:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def last_checkpoint_note(output_dir: str | Path) -> str:
    """Where a stopped run can go on from, in words: the checkpoint ``latest`` names, or that there is none."""
    latest = checkpoint_root(output_dir) / "latest"
    try:
        return f"the last complete checkpoint is {resolve_checkpoint(latest)} (continue with --resume latest)"
    except (FileNotFoundError, OSError, ValueError):
        return f"no checkpoint was completed in {checkpoint_root(output_dir)}"


# ---------------------------------------------------------------- resuming


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _check_torch_file(path: Path) -> None:
    """A ``torch.save`` file (a zip archive) whose every member is complete (CRC-checked): truncation and most
    corruption fail here, naming the file, instead of deep inside ``torch.load``."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: damaged or truncated ({_first_line(exc)})") from None
    if bad is not None:
        raise CheckpointError(f"{path}: damaged (member {bad} fails its checksum)")


def read_rng_state(path: Path) -> tuple[dict | None, str]:
    """(the RNG state saved in ``path``, "") or (None, what is wrong with it). Loaded like accelerate loads it but
    never executing pickled code: ``weights_only=True`` with accelerate's numpy allow-list."""
    from accelerate.utils import load

    if not path.is_file():
        return None, f"{path} is missing"
    try:
        states = load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        return None, f"{path} cannot be read ({_first_line(exc)})"
    needed = RNG_KEYS + (("torch_cuda_manual_seed",) if torch.cuda.is_available() else ())
    missing = [k for k in needed if not isinstance(states, dict) or k not in states]
    if missing:
        return None, f"{path} lacks {missing}"
    return states, ""


def _rng_error(problem: str) -> CheckpointError:
    return CheckpointError(
        f"{problem}: the random state cannot be restored, so the resume would not be exact "
        "(pass train.allow_rng_reset=true to resume with fresh random streams; the run records it)"
    )


def _trainer_state(path: Path) -> dict:
    """The checkpoint's ``trainer_state.json``, checked to hold a non-negative integer ``step``."""
    state_file = path / "trainer_state.json"
    try:
        state = json.loads(read_text_bounded(state_file, MAX_STATE_BYTES))
        step = state["step"]
    except FileNotFoundError:
        raise CheckpointError(f"{state_file} is missing: {path} is not a complete checkpoint") from None
    except (json.JSONDecodeError, ValueError, KeyError, TypeError) as exc:  # a non-regular file: ValueError
        raise CheckpointError(f"{state_file}: damaged ({_first_line(exc)})") from None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{state_file}: 'step' must be a non-negative integer, got {step!r}")
    return state


def check_regular_files(checkpoint: Path) -> None:
    """Every entry of ``checkpoint`` (its subfolders included) is a folder or a regular file, or a
    :class:`CheckpointError` names the first that is not, before any is opened: a named pipe as ``optimizer.bin``
    would block the resume forever, a device would be read without end, a link to itself fails to open."""
    for parent, _, files in os.walk(checkpoint):  # a link loop is listed with the files
        for name in sorted(files):
            try:
                check_regular_file(os.path.join(parent, name))
            except (FileNotFoundError, ValueError) as exc:  # a link to nothing, a pipe, a device, a link loop
                raise CheckpointError(f"{exc}: {checkpoint} is not a checkpoint to resume from") from None


def check_resume(
    output_dir: str | Path, resume: str, num_processes: int, allow_rng_reset: bool = False
) -> ResumePoint | None:
    """The checkpoint to resume from, checked before any model is built or any run file is written.

    ``resume`` as :func:`find_resume` takes it (a missing explicit path raises FileNotFoundError). Every
    ``*.safetensors`` must be complete, every accelerate ``*.bin`` an intact torch archive, and each of the
    ``num_processes`` RNG files readable; the first problem raises :class:`CheckpointError` naming its file. A
    missing or unreadable RNG file is accepted only with ``allow_rng_reset`` (recorded in the returned point)."""
    path = find_resume(output_dir, resume)
    if path is None:
        return None
    check_regular_files(path)
    step = _trainer_state(path)["step"]
    try:
        for weights in sorted(path.rglob("*.safetensors")):
            check_safetensors(weights)
    except DamagedFileError as exc:
        raise CheckpointError(str(exc)) from None
    for state in sorted(path.glob("*.bin")):
        _check_torch_file(state)
    problems = [p for rank in range(num_processes) if (p := read_rng_state(path / RNG_FILE.format(rank=rank))[1])]
    if problems and not allow_rng_reset:
        raise _rng_error(problems[0])
    return ResumePoint(path, step, "; ".join(problems))


def load_checkpoint(
    accelerator, path: str | Path, load_weights: Callable[[Path], None] | None = None, allow_rng_reset: bool = False
) -> dict:
    """Restore optimizer, scheduler, every process's RNG and, with ``load_weights``, the weights; returns the trainer
    state.

    A file that fails to load raises :class:`CheckpointError` naming the checkpoint; this process's RNG state must
    be restored (checked against the saved one) unless ``allow_rng_reset``."""
    path = resolve_checkpoint(path)
    state = _trainer_state(path)
    rng_file = path / RNG_FILE.format(rank=accelerator.process_index)
    saved, problem = read_rng_state(rng_file)
    if problem and not allow_rng_reset:
        raise _rng_error(problem)
    try:
        if load_weights is not None:
            load_weights(path)
        accelerator.load_state(str(path), **_engine_kwargs(accelerator, saving=False))
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, KeyError) as exc:
        raise CheckpointError(f"{path}: could not be loaded ({_first_line(exc)})") from None
    if saved is not None and not torch.equal(torch.get_rng_state(), saved["torch_manual_seed"]):
        raise CheckpointError(f"{rng_file}: loaded, but the random state was not restored")
    return state
