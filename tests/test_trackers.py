"""`train.report_to` as the user names it: a tiny stage (b) run logs to a real offline wandb run and a real
TensorBoard event file, and what they hold reads back equal to the run's own metrics.csv."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.stage_runs import stage_b_overrides
from tests.helpers.trackers import read_tensorboard_scalars, read_wandb_run

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
pytestmark = pytest.mark.slow


def train(tmp_path: Path, tiny_mistral_dir, name: str, report_to: str) -> Path:
    out = tmp_path / name
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / f"{name}_wandb"),
           "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(ROOT / "scripts" / "train_stage_b.py"), "--config",
            str(ROOT / "configs" / "tiny" / "stage_b.yaml"),
            *stage_b_overrides(tmp_path, tiny_mistral_dir, out), f"train.report_to={report_to}",
            f"train.max_steps={STEPS}"]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def csv_losses(run_dir: Path) -> list[float]:
    rows = [r for r in csv.reader(open(run_dir / "metrics.csv")) if r[0] != "step" and r[1] == "loss"]
    return [float(value) for _, _, value, _ in rows]


def test_wandb_offline_and_tensorboard_hold_the_runs_metrics_and_config(tmp_path, tiny_mistral_dir):
    expected = csv_losses(train(tmp_path, tiny_mistral_dir, "csv", "csv"))
    assert len(expected) == STEPS

    train(tmp_path, tiny_mistral_dir, "wandb", "wandb")
    (run_dir,) = (tmp_path / "wandb_wandb" / "wandb").glob("offline-run-*")
    history, config = read_wandb_run(run_dir)
    assert [row["_step"] for row in history] == list(range(1, STEPS + 1))
    assert [row["loss"] for row in history] == pytest.approx(expected, rel=1e-6)  # the same deterministic run
    assert {"ce", "mse", "lr", "grad_norm"} <= set(history[0])
    assert config["train.lr"] == pytest.approx(3e-3) and config["train.max_steps"] == STEPS
    assert config["train.report_to"] == "wandb"

    tb_run = train(tmp_path, tiny_mistral_dir, "tensorboard", "tensorboard")
    scalars = read_tensorboard_scalars(tb_run / "logs")
    assert [step for step, _ in scalars["loss"]] == list(range(1, STEPS + 1))
    assert [value for _, value in scalars["loss"]] == pytest.approx(expected, rel=1e-6)
    assert {"ce", "mse", "lr"} <= set(scalars)
