"""Checkpoints that make a run resumable exactly and rebuildable from its directory.

    output_dir/checkpoints/step_0000200/
        <model parts>          written by the stage's ``save_weights(dir)`` (safetensors + adapter configs)
        optimizer.bin, scheduler.bin, random_states_<rank>.pkl ...   accelerate's state (RNG of every process)
        trainer_state.json     step, samples seen, last losses
    output_dir/checkpoints/latest   text file naming the newest complete checkpoint

A checkpoint is written to ``step_X.tmp`` and renamed when complete, so a crash never leaves a half checkpoint
that ``--resume latest`` would pick up. Only trained parameters are saved: accelerate's own model saving is
switched off by :func:`skip_model_weights_in_state`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from animegamer.io import atomic_write_json, atomic_write_text

STEP_PREFIX = "step_"


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
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX) and not p.name.endswith(".tmp")]
    return sorted(done, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a path that may be a run dir, its ``checkpoints/latest`` file, or a step dir."""
    path = Path(path)
    if path.is_file() and path.name == "latest":
        path = path.parent / path.read_text().strip()
    elif path.name == "latest" and not path.exists() and (path.parent / "latest").is_file():
        path = path.parent / (path.parent / "latest").read_text().strip()
    elif (path / "checkpoints" / "latest").is_file():
        path = path / "checkpoints" / (path / "checkpoints" / "latest").read_text().strip()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def find_resume(output_dir: str | Path, resume: str) -> Path | None:
    """The checkpoint to resume from: ``""`` none, ``latest`` the newest in output_dir (None if there is none)."""
    if not resume:
        return None
    if resume == "latest":
        found = list_checkpoints(output_dir)
        return found[-1] if found else None
    return resolve_checkpoint(resume)


def save_checkpoint(
    accelerator,
    output_dir: str | Path,
    step: int,
    save_weights: Callable[[Path], None],
    trainer_state: dict,
    keep: int = 3,
) -> Path:
    """Write a complete checkpoint for optimizer step ``step``; prune to the newest ``keep``."""
    root = checkpoint_root(output_dir)
    final = root / f"{STEP_PREFIX}{step:07d}"
    tmp = root / f"{final.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), **_engine_kwargs(accelerator, saving=True))
    accelerator.wait_for_everyone()  # every rank's RNG file is in tmp before it is renamed
    if accelerator.is_main_process:
        save_weights(tmp)
        atomic_write_json(tmp / "trainer_state.json", {"step": step, **trainer_state})
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        atomic_write_text(root / "latest", final.name + "\n")
        if keep > 0:
            for old in list_checkpoints(output_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: str | Path, load_weights: Callable[[Path], None]) -> dict:
    """Restore weights, optimizer, scheduler and every process's RNG; returns the trainer state."""
    path = resolve_checkpoint(path)
    load_weights(path)
    accelerator.load_state(str(path), **_engine_kwargs(accelerator, saving=False))
    return json.loads((path / "trainer_state.json").read_text())
