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

from accelerate import Accelerator, PartialState
from accelerate.tracking import GeneralTracker
from accelerate.utils import ProjectConfiguration, parse_flag_from_env

from animegamer.config import TrainConfig, to_yaml
from animegamer.io import atomic_write_json, atomic_write_text


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        self._file = open(self.path, "a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(["step", "name", "value", "time"])

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
        self._file.close()


def build_accelerator(output_dir: str, train: TrainConfig):
    """An :class:`accelerate.Accelerator` for a stage: mixed precision, grad accumulation, trackers in output_dir."""
    log_with: list[Any] = []
    # PartialState must see ACCELERATE_USE_CPU like Accelerator does, or a 2-process CPU run becomes 2 single runs.
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    if train.report_to == "csv" and state.is_main_process:  # one writer, or ranks clobber the header
        log_with = [CSVTracker(run_name="run", logging_dir=output_dir)]
    elif train.report_to in ("tensorboard", "wandb"):
        log_with = [train.report_to]
    project = ProjectConfiguration(project_dir=output_dir, logging_dir=str(Path(output_dir) / "logs"))
    return Accelerator(
        mixed_precision=train.mixed_precision,
        gradient_accumulation_steps=train.grad_accum,
        log_with=log_with or None,
        project_config=project,
        step_scheduler_with_optimizer=False,
    )


def start_run(accelerator, cfg: Any, project: str) -> Path:
    """Write the resolved config, git SHA and command line beside the run; start trackers. Returns output_dir."""
    out = Path(cfg.output_dir)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.yaml", to_yaml(cfg))
        atomic_write_json(
            out / "run_info.json",
            {
                "git_sha": git_sha(),
                "command": " ".join(sys.argv),
                "num_processes": accelerator.num_processes,
                "mixed_precision": accelerator.mixed_precision,
                "distributed_type": str(accelerator.distributed_type),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "versions": _versions(),
            },
        )
    accelerator.wait_for_everyone()
    flat = _flatten(json.loads(json.dumps(_to_plain(cfg), default=str)))
    accelerator.init_trackers(project, config=flat)
    return out


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "diffusers", "transformers", "peft", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def _to_plain(cfg: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg))


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


def configure_deepspeed(accelerator, train: TrainConfig) -> None:
    """Tell DeepSpeed the batch settings: no prepared DataLoader does, and our config is the source of truth."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    ds_config["train_micro_batch_size_per_gpu"] = train.batch_size
    ds_config["gradient_accumulation_steps"] = train.grad_accum
    ds_config["gradient_clipping"] = train.max_grad_norm  # DeepSpeed clips inside its step
