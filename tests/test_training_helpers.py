import csv
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from animegamer.config import TrainConfig
from animegamer.models.weights import DamagedFileError, load_state_dict_file
from animegamer.training import checkpoint
from animegamer.training.batches import ResumableBatchSampler
from animegamer.training.checkpoint import (
    CheckpointError,
    check_resume,
    find_resume,
    list_checkpoints,
    read_rng_state,
    replace_dir,
    resolve_checkpoint,
    write_dir_atomically,
)
from animegamer.training.optim import build_optimizer, lr_factor
from animegamer.training.run import trim_metrics
from tests.helpers.pickle_trap import PickleTrap
from tests.helpers.toy_run import toy_run


def test_sampler_is_a_pure_function_of_position():
    full = ResumableBatchSampler(10, batch_size=3, seed=1)
    it = iter(full)
    first = [next(it) for _ in range(8)]
    resumed = iter(ResumableBatchSampler(10, batch_size=3, seed=1, start_batch=5))
    assert [next(resumed) for _ in range(3)] == first[5:]
    # every epoch covers every item once
    flat = [i for b in first for i in b][:20]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    # ranks split the global batch without overlap
    r0 = next(iter(ResumableBatchSampler(10, 2, seed=1, rank=0, world_size=2)))
    r1 = next(iter(ResumableBatchSampler(10, 2, seed=1, rank=1, world_size=2)))
    assert not set(r0) & set(r1) and len(r0 + r1) == 4
    with pytest.raises(ValueError):
        ResumableBatchSampler(0, 2)


def test_lr_schedules():
    t = TrainConfig(max_steps=110, lr_warmup_steps=10, lr_scheduler="cosine")
    assert lr_factor(0, t) == pytest.approx(0.1) and lr_factor(9, t) == pytest.approx(1.0)
    assert lr_factor(60, t) == pytest.approx(0.5) and lr_factor(110, t) == pytest.approx(0.0, abs=1e-9)
    assert lr_factor(50, TrainConfig(lr_scheduler="constant")) == 1.0
    assert lr_factor(60, TrainConfig(max_steps=110, lr_warmup_steps=10, lr_scheduler="linear")) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no trainable"):
        build_optimizer([], t)


def test_exact_resume_and_checkpoint_files(tmp_path):
    straight = toy_run(tmp_path / "a", 4)
    toy_run(tmp_path / "b", 2)
    resumed = toy_run(tmp_path / "b", 4, resume="latest")
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    ckpts = list_checkpoints(tmp_path / "b")
    assert [p.name for p in ckpts] == ["step_0000004"]  # keep=1 pruned step 2
    assert (ckpts[0] / "model.safetensors").is_file() and (ckpts[0] / "trainer_state.json").is_file()
    assert not list((tmp_path / "b" / "checkpoints").glob("*.tmp"))
    assert resolve_checkpoint(tmp_path / "b") == ckpts[0]
    assert resolve_checkpoint(tmp_path / "b" / "checkpoints" / "latest") == ckpts[0]
    assert (tmp_path / "b" / "config.yaml").read_text().startswith("kind: stage_a")
    assert "git_sha" in (tmp_path / "b" / "run_info.json").read_text()
    rows = list(csv.DictReader(open(tmp_path / "b" / "metrics.csv")))
    assert [int(r["step"]) for r in rows if r["name"] == "loss"] == [1, 2, 3, 4]
    with pytest.raises(FileNotFoundError):
        resolve_checkpoint(tmp_path / "nothing")
    assert find_resume(tmp_path / "empty", "latest") is None and find_resume(tmp_path, "") is None
    # a latest file names a step directory beside it, never a path out of the checkpoint folder
    (tmp_path / "a" / "checkpoints" / "latest").write_text(f"../../b/checkpoints/{ckpts[0].name}\n")
    for path in (tmp_path / "a", tmp_path / "a" / "checkpoints" / "latest"):
        with pytest.raises(FileNotFoundError, match="not a step_N directory"):
            resolve_checkpoint(path)


# ---------------------------------------------------------------- resume safety (issue 22)


def test_resume_drops_the_metrics_rows_a_killed_run_logged_after_its_checkpoint(tmp_path):
    toy_run(tmp_path, 3)  # killed after step 3: checkpoint at 2, rows for 1..3
    toy_run(tmp_path, 4, resume="latest")  # resumes at 2, logs 3 and 4 again
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["step"]) for r in rows if r["name"] == "loss"] == [1, 2, 3, 4]
    assert not list(tmp_path.glob(".metrics*"))  # the atomic rewrite's temp file is gone
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["resumed_step"] == 2 and "rng_reset" not in info
    # rows with any step are kept up to the resumed one, the header stays
    path = tmp_path / "by_hand.csv"
    path.write_text("step,name,value,time\n1,loss,3,0\n2,loss,2,0\n5,loss,1,0\n2,lr,1,0\n")
    assert trim_metrics(path, 2) == 1
    assert path.read_text().splitlines() == ["step,name,value,time", "1,loss,3,0", "2,loss,2,0", "2,lr,1,0"]


def test_a_missing_rng_state_fails_unless_allowed_and_then_is_recorded(tmp_path, capsys):
    toy_run(tmp_path, 2)
    rng = tmp_path / "checkpoints" / "step_0000002" / "random_states_0.pkl"
    rng.unlink()
    with pytest.raises(CheckpointError, match=r"random_states_0\.pkl is missing.*allow_rng_reset=true"):
        toy_run(tmp_path, 4, resume="latest")
    assert "resumed_step" not in json.loads((tmp_path / "run_info.json").read_text())  # nothing was rewritten
    toy_run(tmp_path, 4, resume="latest", allow_rng_reset=True)
    assert "WARNING" in capsys.readouterr().err
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["resumed_step"] == 2 and "random_states_0.pkl is missing" in info["rng_reset"]
    assert json.loads((tmp_path / "checkpoints" / "step_0000004" / "trainer_state.json").read_text())["step"] == 4
    # two processes need two RNG files: a one-process checkpoint cannot resume a two-process run exactly
    with pytest.raises(CheckpointError, match=r"random_states_1\.pkl is missing"):
        check_resume(tmp_path, "latest", num_processes=2)


def test_an_rng_state_holding_code_is_refused_and_never_run(tmp_path):
    toy_run(tmp_path, 2)
    marker = tmp_path / "code_ran"
    rng = tmp_path / "checkpoints" / "step_0000002" / "random_states_0.pkl"
    torch.save({"random_state": PickleTrap(marker)}, rng)
    with pytest.raises(CheckpointError, match=r"random_states_0\.pkl cannot be read"):
        check_resume(tmp_path, "latest", num_processes=1)
    with pytest.raises(CheckpointError, match=r"random_states_0\.pkl cannot be read"):
        toy_run(tmp_path, 4, resume="latest")
    assert not marker.exists()
    states, problem = read_rng_state(rng)
    assert states is None and problem and not marker.exists()


@pytest.mark.parametrize("name", ["optimizer.bin", "scheduler.bin", "model.safetensors", "trainer_state.json"])
def test_a_truncated_checkpoint_file_is_named(tmp_path, name):
    toy_run(tmp_path, 2)
    damaged = tmp_path / "checkpoints" / "step_0000002" / name
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="damaged") as err:
        check_resume(tmp_path, "latest", num_processes=1)
    assert str(damaged) in str(err.value) and "\n" not in str(err.value)
    if name == "model.safetensors":  # trained weights are checked wherever they load
        with pytest.raises(DamagedFileError, match="truncated"):
            load_state_dict_file(damaged)


def test_torch_weights_that_are_not_a_zip_archive_are_named(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x80\x02not really a pickle")
    with pytest.raises(DamagedFileError, match=str(path)):
        load_state_dict_file(path)


def test_resaving_a_step_never_leaves_latest_naming_a_missing_directory(tmp_path, monkeypatch):
    """A run restarted in the same directory saves step 2 again over the old step 2 that ``latest`` names. After
    every deletion of a directory, ``latest`` must still name a complete checkpoint."""
    toy_run(tmp_path, 2, keep=10)
    latest = tmp_path / "checkpoints" / "latest"
    real_rmtree = shutil.rmtree
    deleted = []

    def checked_rmtree(path, *args, **kwargs):
        real_rmtree(path, *args, **kwargs)
        deleted.append(Path(path).name)
        named = resolve_checkpoint(latest)
        assert (named / "trainer_state.json").is_file() and (named / "model.safetensors").is_file(), deleted

    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", checked_rmtree)
    monkeypatch.setattr(checkpoint.os, "fsync", recording_fsync)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints" / "step_0000002").iterdir()}
    toy_run(tmp_path, 2, keep=10)  # a fresh run: saves step 2 again
    step = tmp_path / "checkpoints" / "step_0000002"
    assert "step_0000002.tmp" in deleted  # the old contents, swapped out and then deleted
    assert {p.name: p.stat().st_mtime_ns for p in step.iterdir()} != before  # the new checkpoint is in place
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step_")] == [step.name]
    # every file of the checkpoint was flushed to disk before it was published
    assert {p.name for p in step.iterdir()} <= {Path(s).name for s in synced}


def test_write_dir_atomically_keeps_the_old_directory_when_writing_fails(tmp_path):
    final = tmp_path / "vae"
    final.mkdir()
    (final / "config.json").write_text("old")

    def crash(tmp):
        (tmp / "config.json").write_text("new")
        raise RuntimeError("killed while saving")

    with pytest.raises(RuntimeError):
        write_dir_atomically(final, crash)
    assert (final / "config.json").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["vae"]
    write_dir_atomically(final, lambda tmp: (tmp / "weights").write_text("new"))
    assert sorted(p.name for p in final.iterdir()) == ["weights"]  # replaced whole, nothing of the old left
    replace_dir(_make(tmp_path / "fresh"), tmp_path / "new_place")  # onto a path that does not exist yet
    assert (tmp_path / "new_place" / "file").is_file()


def _make(path: Path) -> Path:
    path.mkdir()
    (path / "file").write_text("x")
    return path
