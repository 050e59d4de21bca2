"""Resuming a run, in the three calls the training loop (training/loop.py) makes:

    resume = resume_point(cfg, accelerator)             before any model is built: the checkpoint checked
    load_resume_weights(resume, recipe.load_weights)    into the bare model, before ``accelerator.prepare``
    step = restore(accelerator, resume, allow_rng_reset)   optimizer, schedule, every process's RNG

What a resume may change: the recipe of a run (what each step computes) is compared with the one the checkpoint's
run recorded, and a change is refused in one line naming the keys unless ``train.allow_recipe_change=true``.

The recorded recipe is the run's ``config.yaml`` and ``run_info.json`` beside its ``checkpoints`` folder (written
by :func:`animegamer.training.run.start_run`). Every config key is part of the recipe (a knob added later is too)
except those that only say how often to log or save, where to write and how to resume (:data:`FREE_KEYS`), plus
``train.max_steps`` while both schedules are ``constant`` (extending a run then changes no step it has taken).
The launch is part of it too: the number of processes and the engine (DDP, DeepSpeed's ZeRO stage and offload).

An allowed change is printed and recorded in ``run_info.json`` (``recipe_changed``). Two changes are refused even
then, since the checkpoint cannot be loaded: a DeepSpeed checkpoint on another number of processes or another engine
(its optimizer state is partitioned over the processes that saved it), and a checkpoint past ``train.max_steps``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from animegamer.cli import UsageError
from animegamer.io import read_text_bounded
from animegamer.training.checkpoint import CheckpointError, ResumePoint, check_resume, load_checkpoint
from animegamer.training.engines import engine_info
from animegamer.training.run import flatten, plain_config

# keys that do not change what a step computes: logging, saving, where the run writes, how it resumes, how fast
FREE_KEYS = frozenset({
    "output_dir",
    "train.resume",
    "train.allow_rng_reset",
    "train.allow_recipe_change",
    "train.log_every",
    "train.report_to",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.compile",
})
FREE_LEAVES = frozenset({"num_workers", "gradient_checkpointing"})  # under any section (data., mllm., decoder.)
MAX_RECORD_BYTES = 1 << 20  # config.yaml / run_info.json


def resume_point(cfg: Any, accelerator) -> ResumePoint | None:
    """The checkpoint a stage resumes from (``cfg.train.resume``), checked in full before any model is built or any
    run file written: its files (:func:`animegamer.training.checkpoint.check_resume`), its step (at most
    ``train.max_steps``) and its recipe against this run's. Any problem raises :class:`CheckpointError` (one line);
    an allowed recipe change is kept in the returned point's ``recipe_changes``."""
    train = cfg.train
    point = check_resume(cfg.output_dir, train.resume, accelerator.num_processes, train.allow_rng_reset)
    if point is None:
        return None
    if point.step > train.max_steps:
        raise CheckpointError(
            f"{point.path} is at step {point.step}, past train.max_steps={train.max_steps}: raise train.max_steps "
            "to train it further"
        )
    run_dir = point.path.parent.parent if point.path.parent.name == "checkpoints" else None
    recorded_cfg = _read_record(run_dir, "config.yaml") if run_dir else None
    recorded_launch = _read_record(run_dir, "run_info.json") if run_dir else None
    if recorded_launch:
        _check_loadable(point.path, recorded_launch, launch_of(accelerator))
    changes = {} if recorded_cfg is None else config_changes(recorded_cfg, plain_config(cfg))
    if recorded_launch:
        changes |= launch_changes(recorded_launch, launch_of(accelerator))
    if recorded_cfg is None and accelerator.is_main_process:
        print(f"warning: no recorded config.yaml beside {point.path}: the recipe of the resume is not checked",
              file=sys.stderr)
    if changes and not train.allow_recipe_change:
        listed = ", ".join(f"{key} {_short(c['was'])} -> {_short(c['now'])}" for key, c in changes.items())
        raise CheckpointError(
            f"resuming from {point.path} would change the recipe its run recorded: {listed}; resume with the "
            "recorded values, or pass train.allow_recipe_change=true to go on with the new ones (recorded in "
            "run_info.json)"
        )
    point.recipe_changes = changes
    return point


def load_resume_weights(resume: ResumePoint | None, load: Callable[[Path], None]) -> None:
    """``load(checkpoint_dir)`` the resume point's trained weights into the bare model, before
    ``accelerator.prepare``: ZeRO-3 and FSDP2 then shard the restored values like any others (the engine restores
    its own optimizer state afterwards, :func:`restore`). A checkpoint that does not load is a
    :class:`~animegamer.cli.UsageError` naming it. Nothing to do without a resume point."""
    if resume is None:
        return
    try:
        load(resume.path)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        raise UsageError(f"{resume.path}: could not be loaded "
                         f"({(str(exc).strip().splitlines() or [type(exc).__name__])[0]})") from None


def restore(accelerator, resume: ResumePoint | None, allow_rng_reset: bool) -> int:
    """The optimizer step a run starts from: 0, or ``resume``'s step once its optimizer, scheduler and every
    process's RNG are restored (the weights: :func:`load_resume_weights`, before ``prepare``). A checkpoint that
    fails to load is a :class:`~animegamer.cli.UsageError` naming the file."""
    if resume is None:
        return 0
    try:
        step = load_checkpoint(accelerator, resume.path, allow_rng_reset=allow_rng_reset)["step"]
    except (FileNotFoundError, ValueError) as exc:  # CheckpointError and DamagedFileError are ValueErrors
        raise UsageError(str(exc)) from None
    accelerator.print(f"resumed from {resume.path} at step {step}")
    return step


def config_changes(recorded: dict, current: dict) -> dict[str, dict]:
    """The keys (dotted) whose value shapes the run and differs between the ``recorded`` config and the
    ``current`` one: ``{key: {"was": ..., "now": ...}}``. A key only one side has (a knob added or removed since)
    is not a change."""
    was, now = flatten(recorded), flatten(current)
    constant = was.get("train.lr_scheduler") == now.get("train.lr_scheduler") == "constant"
    changes = {}
    for key in sorted(was.keys() & now.keys()):
        if key in FREE_KEYS or key.rsplit(".", 1)[-1] in FREE_LEAVES or (key == "train.max_steps" and constant):
            continue
        if not _same(was[key], now[key]):
            changes[key] = {"was": was[key], "now": now[key]}
    return changes


def launch_of(accelerator) -> dict[str, Any]:
    """This run's launch as ``run_info.json`` records it: processes, accelerate's distributed type, DeepSpeed."""
    return {"num_processes": accelerator.num_processes, "distributed_type": str(accelerator.distributed_type),
            "deepspeed": engine_info(accelerator)}


def launch_changes(recorded: dict, current: dict) -> dict[str, dict]:
    """The launch keys that differ: ``num_processes``, ``distributed_type``, ``deepspeed`` (a key the record lacks
    is not a change; ``run_info.json`` records ``deepspeed`` only under DeepSpeed)."""
    if "distributed_type" in recorded:
        recorded = {"deepspeed": {}, **recorded}
    return {key: {"was": recorded[key], "now": current[key]} for key in ("num_processes", "distributed_type",
            "deepspeed") if key in recorded and recorded[key] != current[key]}


def _check_loadable(path: Path, recorded: dict, current: dict) -> None:
    """A DeepSpeed checkpoint holds its optimizer state partitioned over the processes that saved it: another
    number of processes or another engine cannot load it (DeepSpeed would fail deep inside with tracebacks)."""
    was_ds, now_ds = recorded.get("deepspeed") or {}, current["deepspeed"]
    same = was_ds == now_ds and recorded.get("num_processes") == current["num_processes"]
    if same or not (was_ds or now_ds):
        return
    raise CheckpointError(
        f"{path} was saved by {_launch(recorded.get('num_processes'), was_ds)}; this run has "
        f"{_launch(current['num_processes'], now_ds)}, which cannot load its optimizer state: resume with the "
        "launch that saved it"
    )


def _launch(processes: Any, deepspeed: dict) -> str:
    engine = f"DeepSpeed ZeRO-{deepspeed.get('zero_stage')}" if deepspeed else "no DeepSpeed"
    return f"{processes} process(es) under {engine}"


def _read_record(run_dir: Path, name: str) -> dict | None:
    """A run file beside the checkpoints (``config.yaml``, ``run_info.json``) as a dict; None if there is none.
    Read as untrusted: bounded, never a pipe or a device, YAML without tags."""
    path = run_dir / name
    if not path.exists():
        return None
    try:
        text = read_text_bounded(path, MAX_RECORD_BYTES)
        data = yaml.safe_load(text) if name.endswith(".yaml") else json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:  # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"{path}: cannot be read as the run's record ({_first(exc)})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not the run's record (a mapping expected)")
    return data


def _same(a: Any, b: Any) -> bool:
    if type(a) in (int, float) and type(b) in (int, float):  # 0.003 recorded, 3e-3 given
        return float(a) == float(b)
    return a == b


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
