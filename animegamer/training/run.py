"""Run setup: the accelerator, trackers, and the files that let a run be rebuilt from its output directory."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.tracking import GeneralTracker
from accelerate.utils import ProjectConfiguration, parse_flag_from_env

from animegamer.cli import parse_config
from animegamer.config import TrainConfig, to_yaml
from animegamer.io import atomic_path, atomic_write_json, atomic_write_text
from animegamer.training.checkpoint import ResumePoint
from animegamer.training.engines import check_world_size, engine_info
from animegamer.training.program import own_output_dir, release_output_dir

METRICS_HEADER = ["step", "name", "value", "time"]


def git_sha() -> str:
    """The commit the code runs from (``-dirty`` when the tree has changes), or ``unknown``."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class CSVTracker(GeneralTracker):
    """An accelerate tracker writing ``metrics.csv`` (step, name, value, time) in the run directory."""

    name = "csv"
    requires_logging_directory = True
    main_process_only = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs):
        super().__init__()
        self.path = Path(logging_dir) / "metrics.csv"
        self._file = None
        self._writer = None

    def start(self) -> None:
        """Open the file when the run starts (``init_trackers``), after :func:`start_run` has trimmed it: a run that
        fails its checks never touches it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        self._file = open(self.path, "a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(METRICS_HEADER)
            self._file.flush()

    @property
    def tracker(self):
        return self._writer

    def store_init_configuration(self, values: dict) -> None:
        pass

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        now = f"{time.time():.3f}"
        for key, value in values.items():
            self._writer.writerow([step, key, value, now])
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()


def trim_metrics(path: Path, last_step: int) -> int:
    """Drop the rows of ``metrics.csv`` logged after ``last_step`` (atomically); returns how many were dropped.

    A run resumed from step S repeats steps S+1.. that a killed run had already logged; without this they would
    appear twice. Rows without a numeric step (the header) are kept."""
    if not path.is_file():
        return 0
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))

    def after(row: list[str]) -> bool:
        try:
            return int(row[0]) > last_step
        except (IndexError, ValueError):
            return False

    kept = [row for row in rows if not after(row)]
    if len(kept) < len(rows):
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
            csv.writer(fh).writerows(kept)
    return len(rows) - len(kept)


def parse_stage_config(schema: type, doc: str | None, argv: list[str] | None = None) -> Any:
    """A training stage's config from ``--config FILE key=value ... [--resume latest|PATH]``; ``--resume`` is the
    same as ``train.resume=...`` and wins over it. Config errors exit with one ``error:`` line (code 2)."""

    def flags(parser):
        parser.add_argument("--resume", help="'latest' or a checkpoint path (same as train.resume=...)")

    cfg, args = parse_config(schema, doc, argv, extra=flags)
    if args.resume:
        cfg.train.resume = args.resume
    return cfg


def build_accelerator(output_dir: str, train: TrainConfig):
    """An :class:`accelerate.Accelerator` for a stage: mixed precision, grad accumulation, trackers in output_dir.

    Before it returns, the launch is checked (:func:`check_world_size`) and the run owns ``output_dir``
    (:func:`animegamer.training.program.own_output_dir`): a second run into a directory a live run holds ends here
    with one ``error:`` line (exit code 2), before anything is read or written."""
    log_with: list[Any] = []
    # PartialState must see ACCELERATE_USE_CPU like Accelerator does, or a 2-process CPU run becomes 2 single runs.
    # DeepSpeed on CPU processes (DS_ACCELERATOR=cpu): accelerate finds no backend for them and would count one
    # process per rank; gloo, which DeepSpeed's CPU accelerator talks over, makes it count the real world size.
    deepspeed_on_cpu = parse_flag_from_env("ACCELERATE_USE_DEEPSPEED") and not torch.cuda.is_available()
    backend = {"backend": "gloo"} if deepspeed_on_cpu else {}
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"), **backend)
    if train.report_to == "csv" and state.is_main_process:  # one writer, or ranks clobber the header
        log_with = [CSVTracker(run_name="run", logging_dir=output_dir)]
    elif train.report_to in ("tensorboard", "wandb"):
        log_with = [train.report_to]
    project = ProjectConfiguration(project_dir=output_dir, logging_dir=str(Path(output_dir) / "logs"))
    accelerator = Accelerator(
        mixed_precision=train.mixed_precision,
        gradient_accumulation_steps=train.grad_accum,
        log_with=log_with or None,
        project_config=project,
        step_scheduler_with_optimizer=False,
    )
    check_world_size(accelerator)  # before the lock: processes that each think they run alone would refuse each other
    own_output_dir(output_dir, accelerator.state, create=False)
    return accelerator


def start_run(accelerator, cfg: Any, project: str, resume: ResumePoint | None = None) -> Path:
    """Write the resolved config, git SHA and command line beside the run; start trackers. Returns output_dir.

    Call it after the data and the resume checkpoint have been checked (and loaded), so a run that fails its checks
    leaves an earlier run's files alone. ``metrics.csv`` keeps only the rows up to the step the run starts from; a
    resume that could not restore every RNG state (``resume.rng_reset``) is printed and recorded in run_info.json.
    """
    out = Path(cfg.output_dir)
    own_output_dir(out, accelerator.state, create=True)  # a no-op where the run took it as it started
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.yaml", to_yaml(cfg))
        info = {
            "git_sha": git_sha(),
            "command": " ".join(sys.argv),
            "num_processes": accelerator.num_processes,
            "mixed_precision": accelerator.mixed_precision,
            "distributed_type": str(accelerator.distributed_type),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "versions": _versions(),
        }
        if engine_info(accelerator):
            info["deepspeed"] = engine_info(accelerator)
        if resume is not None:
            info |= {"resumed_from": str(resume.path), "resumed_step": resume.step}
            if resume.recipe_changes:
                info["recipe_changed"] = resume.recipe_changes
                _warn(resume, f"with a changed recipe: {', '.join(resume.recipe_changes)}", "allow_recipe_change", out)
            if resume.rng_reset:
                info["rng_reset"] = resume.rng_reset
                _warn(resume, f"with fresh random streams, not an exact resume: {resume.rng_reset}",
                      "allow_rng_reset", out)
        atomic_write_json(out / "run_info.json", info)
        trim_metrics(out / "metrics.csv", resume.step if resume is not None else 0)
    accelerator.wait_for_everyone()
    flat = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten(plain_config(cfg)).items()}
    accelerator.init_trackers(project, config=flat)
    return out


def end_run(accelerator) -> None:
    """The end of a run: trackers closed (``accelerator.end_training``), every process done, the output directory
    let go for the next run."""
    accelerator.wait_for_everyone()  # end_training ends the process group: no barrier after it
    accelerator.end_training()
    release_output_dir()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "diffusers", "transformers", "peft", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def _warn(resume: ResumePoint, how: str, knob: str, out: Path) -> None:
    print(f"WARNING: resuming from {resume.path} {how} (train.{knob}=true; recorded in {out / 'run_info.json'})",
          file=sys.stderr)


def plain_config(cfg: Any) -> dict:
    """A config dataclass as the plain dict (JSON types) its ``config.yaml`` holds."""
    from omegaconf import OmegaConf

    return json.loads(json.dumps(OmegaConf.to_container(OmegaConf.structured(cfg)), default=str))


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
