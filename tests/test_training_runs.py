"""What a training run does when another run, the disk, a signal or a changed recipe gets in its way: one run per
output directory, nothing half written on a full disk or Ctrl-C, a resume that would change the recipe refused, a
checkpoint file that is a pipe or a device refused before it is opened, checkpoint files with the usual modes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from animegamer.io import LOCK_NAME, current_umask, directory_lock
from animegamer.recipes import stage_b
from animegamer.training.checkpoint import CheckpointError, check_resume, list_checkpoints, resolve_checkpoint
from animegamer.training.program import remove_stale_temp_files
from tests.helpers.processes import (
    STAGE_B_CONFIG,
    Child,
    child_env,
    error_lines,
    file_size_limit,
    stage_b_command,
    temp_leftovers,
    toy_command,
)
from tests.helpers.stage_runs import stage_b_overrides
from tests.helpers.stage_scripts import ROOT, logged_losses
from tests.helpers.toy_run import RAW_SAFETENSORS, toy_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _latest(run: Path) -> str:
    return (run / "checkpoints" / "latest").read_text().strip()


def _one_last_line(output: str, start: str) -> str:
    """The output's last non-empty line, which must start with ``start``; no traceback anywhere."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(start) and "Traceback" not in output, output[-3000:]
    return lines[-1]


def _modes(run: Path) -> dict[str, int]:
    """Permission bits of every file and folder under ``run/checkpoints``."""
    root = run / "checkpoints"
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


# ---------------------------------------------------------------- one run per output directory


@pytest.mark.slow
@pytest.mark.parametrize("existing", [True, False], ids=["into_an_existing_dir", "into_a_new_dir"])
def test_a_second_run_into_a_live_runs_directory_is_refused_and_the_first_finishes(tmp_path, tiny_mistral_dir,
                                                                                  existing):
    """Two real ``python scripts/train_stage_b.py`` into one directory: the second ends in one ``error:`` line
    naming the first's PID (exit 2) and writes nothing; the first, frozen meanwhile, then finishes with every step
    logged and its checkpoints, and its files get the usual modes (peft's adapter included)."""
    out = tmp_path / "run"
    if existing:
        out.mkdir()
    overrides = stage_b_overrides(tmp_path, tiny_mistral_dir, out,
                                  **{"train.max_steps": 4, "train.report_to": "csv", "train.log_every": 1})
    first = Child(stage_b_command(overrides))
    # the first holds the directory from these lines on: as it starts where the directory exists, else at its
    # first write (the progress bar comes after it)
    first.wait_for("stage (b) data:" if existing else "stage b:")
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(stage_b_command(overrides), capture_output=True, text=True, env=child_env(),
                                cwd=ROOT, timeout=300)
        config = (out / "config.yaml").read_text() if (out / "config.yaml").exists() else None
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    assert second.returncode == 2, second.stderr[-3000:]
    line = _one_last_line(second.stderr, "error: ")
    assert error_lines(second.stderr) == [line] and f"PID {first.proc.pid}" in line and "train_stage_b.py" in line
    assert "in use by" in line and str(out) in line
    assert first.finish() == 0, first.output()[-3000:]
    assert (out / "config.yaml").read_text() == config or config is None  # the second never wrote it
    assert len(logged_losses(out)) == 4
    assert _latest(out) == "step_0000004" and [p.name for p in list_checkpoints(out)][-1] == "step_0000004"
    assert not temp_leftovers(out)
    usual = 0o666 & ~current_umask()
    modes = _modes(out)
    assert "step_0000004/adapter_model.safetensors" in modes
    assert all(mode == (0o777 & ~current_umask() if (out / "checkpoints" / name).is_dir() else usual)
               for name, mode in modes.items()), modes


@pytest.mark.slow
def test_a_killed_runs_lock_is_taken_over_and_its_temp_files_removed(tmp_path):
    """A run killed with SIGKILL leaves its lock file and temp files; the next run takes the directory over and
    removes the temp files it left (and nothing else)."""
    out = tmp_path / "run"
    killed = Child(toy_command(out, 10_000, max_steps=10_000, checkpoint_every=1))

    _wait_until(lambda: (out / "checkpoints" / "latest").exists(), killed)
    killed.proc.kill()
    killed.finish()
    planted = [out / "checkpoints" / "step_0000099.tmp", out / ".config.k3j2abcd.tmp.yaml",
               out / "checkpoints" / ".latest.q1w2e3r4.tmp"]
    planted[0].mkdir()
    (planted[0] / "optimizer.bin").write_bytes(b"half")
    for path in planted[1:]:
        path.write_text("half")
    kept = [out / "notes.tmp.txt", out / "checkpoints" / "README"]
    for path in kept:
        path.write_text("mine")
    (out / ".outside.tmp").symlink_to(tmp_path / "elsewhere")  # a link is never ours: left alone

    toy_run(out, 2, keep=10)  # this process now: takes the dead run's lock over
    assert not any(p.exists() for p in planted)
    assert all(p.read_text() == "mine" for p in kept) and (out / ".outside.tmp").is_symlink()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not list((out / "checkpoints").glob("*.tmp"))  # nor a step the killed run was writing


def test_a_run_lets_its_directory_go_however_it_ends(tmp_path, tiny_mistral_dir, capsys):
    """In a process that goes on (a test, a chain of stages): after a run refused for a bad resume, a bad recipe
    or a bad manifest, and after a finished one, the directory is free for the next holder."""
    script = stage_b
    out = tmp_path / "run"
    out.mkdir()
    argv = ["--config", str(STAGE_B_CONFIG), *stage_b_overrides(tmp_path, tiny_mistral_dir, out)]
    for extra in (["train.resume=" + str(tmp_path / "nowhere")], [f"data.manifest={tmp_path / 'none.jsonl'}"]):
        with pytest.raises(SystemExit):
            script.main([*argv, *extra])
        with directory_lock(out, "the next holder"):
            pass
    toy_run(tmp_path / "toy", 2)
    with pytest.raises(CheckpointError):
        toy_run(tmp_path / "toy", 4, resume="latest", lr=0.5)
    for run in (out, tmp_path / "toy"):
        with directory_lock(run, "the next holder"):
            pass
    capsys.readouterr()


def test_stale_temp_files_are_told_apart_from_the_runs_files(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_0000002").mkdir(parents=True)
    stale = [run / "checkpoints" / "step_0000004.tmp", run / ".run_info.x81.tmp.json", run / ".vae.tmp",
             run / "checkpoints" / ".latest.abc.tmp"]
    stale[0].mkdir()
    stale[2].mkdir()
    for path in (stale[1], stale[3]):
        path.write_text("x")
    keep = [run / "metrics.csv", run / "config.yaml", run / "checkpoints" / "latest", run / "tmp.txt",
            run / "checkpoints" / "step_0000002.old"]
    for path in keep:
        path.write_text("x")
    assert sorted(remove_stale_temp_files(run)) == sorted(stale)
    assert all(p.exists() for p in keep) and (run / "checkpoints" / "step_0000002").is_dir()
    assert "removed 4 temp file(s)" in capsys.readouterr().err
    assert remove_stale_temp_files(tmp_path / "nothing") == []


def _wait_until(condition, child: Child, timeout: float = 300) -> None:
    """Wait for ``condition()`` while ``child`` runs (a file it writes: the event there is no line for). Polled
    every 5 ms: a checkpoint's temp folder lives for a fraction of a second."""
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        assert child.proc.poll() is None, child.output()[-3000:]
        pause.wait(0.005)
    raise AssertionError(f"timed out; output:\n{child.output()[-3000:]}")


# ---------------------------------------------------------------- a resume that changes the recipe


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"lr": 0.1}, "train.lr 0.05 -> 0.1"),
        ({"batch_size": 2}, "train.batch_size 1 -> 2"),
        ({"grad_accum": 2}, "train.grad_accum 1 -> 2"),
        ({"lr_scheduler": "cosine"}, 'train.lr_scheduler "constant" -> "cosine"'),
        ({"betas": [0.8, 0.99]}, "train.betas [0.9, 0.999] -> [0.8, 0.99]"),
        ({"seed": 7}, "seed 42 -> 7"),
        ({"lr": 0.1, "weight_decay": 0.1}, "train.lr 0.05 -> 0.1, train.weight_decay 0.0 -> 0.1"),
    ],
    ids=["lr", "batch_size", "grad_accum", "scheduler", "betas", "seed", "two_keys"],
)
def test_a_resume_that_changes_the_recipe_is_refused_unless_allowed(tmp_path, capsys, change, named):
    toy_run(tmp_path, 2)
    before = {name: (tmp_path / name).read_bytes() for name in ("config.yaml", "run_info.json", "metrics.csv")}
    with pytest.raises(CheckpointError) as refused:
        toy_run(tmp_path, 4, resume="latest", **change)
    message = str(refused.value)
    assert named in message and "allow_recipe_change=true" in message and "\n" not in message, message
    assert {name: (tmp_path / name).read_bytes() for name in before} == before  # nothing was written
    toy_run(tmp_path, 4, resume="latest", allow_recipe_change=True, **change)
    assert "changed recipe" in capsys.readouterr().err
    changed = json.loads((tmp_path / "run_info.json").read_text())["recipe_changed"]
    assert set(changed) == {key if key == "seed" else f"train.{key}" for key in change}
    assert _latest(tmp_path) == "step_0000004"


@pytest.mark.parametrize(
    "change",
    [{"log_every": 5}, {"checkpoint_every": 1}, {"keep_checkpoints": 9}, {"max_steps": 8}, {"compile": False},
     {"allow_rng_reset": True}],
    ids=["log_every", "checkpoint_every", "keep_checkpoints", "max_steps_constant", "compile", "allow_rng_reset"],
)
def test_keys_that_do_not_shape_the_run_may_change_on_a_resume(tmp_path, change):
    toy_run(tmp_path, 2)
    toy_run(tmp_path, 4, resume="latest", **change)
    assert "recipe_changed" not in json.loads((tmp_path / "run_info.json").read_text())
    assert json.loads((tmp_path / "run_info.json").read_text())["resumed_step"] == 2


def test_max_steps_shapes_a_decaying_schedule_and_a_checkpoint_past_it_is_refused(tmp_path):
    toy_run(tmp_path, 2, lr_scheduler="cosine")
    with pytest.raises(CheckpointError, match="train.max_steps 4 -> 8"):
        toy_run(tmp_path, 4, resume="latest", lr_scheduler="cosine", max_steps=8)
    toy_run(tmp_path, 4, resume="latest", lr_scheduler="cosine")
    for max_steps in (3, 1):
        with pytest.raises(CheckpointError, match=f"at step 4, past train.max_steps={max_steps}"):
            toy_run(tmp_path, 4, resume="latest", lr_scheduler="cosine", max_steps=max_steps, allow_recipe_change=True)


@pytest.mark.parametrize(
    ("recorded", "allowed", "needle"),
    [
        ({"num_processes": 2}, True, "num_processes 2 -> 1"),
        ({"num_processes": 4, "distributed_type": "DistributedType.MULTI_GPU"}, True, "num_processes 4 -> 1"),
        ({"num_processes": 2, "distributed_type": "DistributedType.DEEPSPEED",
          "deepspeed": {"zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"}}, False,
         "saved by 2 process(es) under DeepSpeed ZeRO-2; this run has 1 process(es) under no DeepSpeed"),
        ({"num_processes": 1, "distributed_type": "DistributedType.DEEPSPEED",
          "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}}, False,
         "under DeepSpeed ZeRO-3"),
    ],
    ids=["ddp_2_to_1", "ddp_4_to_1", "zero2_2_to_1", "zero3_to_none"],
)
def test_a_resume_on_another_launch_is_refused(tmp_path, recorded, allowed, needle):
    """Another number of processes changes the batches (refused unless allowed); a DeepSpeed checkpoint cannot be
    loaded by another launch at all (refused even when allowed, before DeepSpeed runs)."""
    toy_run(tmp_path, 2)
    info = json.loads((tmp_path / "run_info.json").read_text())
    (tmp_path / "run_info.json").write_text(json.dumps({**info, **recorded}))
    with pytest.raises(CheckpointError) as refused:
        toy_run(tmp_path, 4, resume="latest")
    assert needle in str(refused.value) and "\n" not in str(refused.value)
    if allowed:
        toy_run(tmp_path, 4, resume="latest", allow_recipe_change=True)
        assert "num_processes" in json.loads((tmp_path / "run_info.json").read_text())["recipe_changed"]
    else:
        with pytest.raises(CheckpointError, match="cannot load its optimizer state"):
            toy_run(tmp_path, 4, resume="latest", allow_recipe_change=True)


@pytest.mark.parametrize("record", ["config.yaml", "run_info.json"])
def test_a_run_record_that_is_a_pipe_or_not_a_mapping_is_refused(tmp_path, record):
    toy_run(tmp_path, 2)
    path = tmp_path / record
    path.write_text("- a list\n" if record.endswith(".yaml") else "[1, 2]\n")
    with pytest.raises(CheckpointError, match="not the run's record"):
        toy_run(tmp_path, 4, resume="latest")
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CheckpointError, match="named pipe"):
        _without_hanging(lambda: toy_run(tmp_path, 4, resume="latest"), path)


# ---------------------------------------------------------------- checkpoint files that are not files


def _without_hanging(call, *fifos: Path, timeout: float = 120):
    """``call()`` in a thread that must end within ``timeout``: if it opened a named pipe and blocks, the pipe is
    opened for writing (so the thread ends) and the test fails."""
    result: dict = {}

    def target():
        try:
            result["value"] = call()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test's thread)
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        for fifo in fifos:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout)
        raise AssertionError("the call blocked opening a named pipe")
    if "error" in result:
        raise result["error"]
    return result.get("value")


@pytest.mark.parametrize("name", ["optimizer.bin", "scheduler.bin", "trainer_state.json", "random_states_0.pkl",
                                  "model.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "device", "link_loop"])
def test_a_checkpoint_file_that_is_a_pipe_a_device_or_a_link_loop_is_refused_before_it_is_opened(tmp_path, name,
                                                                                                 kind):
    toy_run(tmp_path, 2)
    path = tmp_path / "checkpoints" / "step_0000002" / name
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")  # read without end
    else:
        path.symlink_to(path.name)
    said = {"fifo": "a named pipe", "device": "a character device", "link_loop": "cannot be read"}[kind]
    for call in (lambda: check_resume(tmp_path, "latest", num_processes=1, allow_rng_reset=True),
                 lambda: toy_run(tmp_path, 4, resume="latest", allow_rng_reset=True)):
        with pytest.raises(CheckpointError) as refused:
            _without_hanging(call, path)
        assert str(path) in str(refused.value) and said in str(refused.value) and "\n" not in str(refused.value)


# ---------------------------------------------------------------- a full disk, Ctrl-C


@pytest.mark.slow
@pytest.mark.parametrize(
    ("raw_elements", "limit", "needle"),
    [
        # the run files (config.yaml 1.7 kB) fit, optimizer.bin (3 kB) does not: torch.save's RuntimeError
        (0, 2_500, "the checkpoint of step 4 could not be written"),
        # everything fits but the 400 kB raw safetensors: a SafetensorError
        (100_000, 20_000, "the checkpoint of step 4 could not be written"),
        # config.yaml does not fit, before any checkpoint: an OSError outside save_checkpoint
        (0, 1_000, "could not be written (File too large)"),
    ],
    ids=["torch_save", "safetensors", "run_files"],
)
def test_a_full_disk_ends_in_one_line_and_latest_still_names_a_complete_checkpoint(tmp_path, raw_elements, limit,
                                                                                     needle):
    """A resume past a complete checkpoint, under ``ulimit -f`` (every file limited to ``limit`` bytes; the
    first run's files were written without it): one ``error:`` line naming where the run can go on from, exit 1,
    no temp file left, ``latest`` naming the checkpoint it named, which still passes the resume checks."""
    toy_run(tmp_path, 2, keep=10)
    result = subprocess.run(toy_command(tmp_path, 4, resume="latest", raw_elements=raw_elements, keep=10),
                            capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=300,
                            preexec_fn=file_size_limit(limit))
    assert result.returncode == 1, result.stderr[-3000:]
    line = _one_last_line(result.stderr, "error: ")
    assert needle in line and f"the last complete checkpoint is {tmp_path / 'checkpoints' / 'step_0000002'}" in line
    assert not temp_leftovers(tmp_path) and _latest(tmp_path) == "step_0000002"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000002"]
    assert check_resume(tmp_path, "latest", num_processes=1).step == 2


@pytest.mark.slow
def test_a_full_disk_during_a_real_stage_run_ends_in_one_line(tmp_path, tiny_mistral_dir):
    out = tmp_path / "run"
    overrides = stage_b_overrides(tmp_path, tiny_mistral_dir, out, **{"train.max_steps": 2, "train.report_to": "csv"})
    assert subprocess.run(stage_b_command(overrides), capture_output=True, env=child_env(), cwd=ROOT,
                          timeout=300).returncode == 0
    resumed = [*overrides, "train.max_steps=4", "--resume", "latest"]
    result = subprocess.run(stage_b_command(resumed), capture_output=True, text=True, env=child_env(), cwd=ROOT,
                            timeout=300, preexec_fn=file_size_limit(100_000))  # optimizer.bin is ~200 kB
    assert result.returncode == 1, result.stderr[-3000:]
    line = _one_last_line(result.stderr, "error: the checkpoint of step 4 could not be written")
    assert str(out / "checkpoints" / "step_0000002") in line
    assert not temp_leftovers(out) and _latest(out) == "step_0000002"


@pytest.mark.slow
@pytest.mark.parametrize("when", ["building", "training"])
def test_ctrl_c_ends_in_one_line_naming_the_last_checkpoint(tmp_path, tiny_mistral_dir, when):
    """SIGINT, as Ctrl-C sends it, while the model is built or while it trains and saves a checkpoint every step:
    exit 130, one last line saying where the run can go on from, no traceback, no temp file."""
    out = tmp_path / "run"
    overrides = stage_b_overrides(tmp_path, tiny_mistral_dir, out, **{
        "train.max_steps": 100_000, "train.checkpoint_every": 1, "train.report_to": "csv"})
    child = Child(stage_b_command(overrides))
    child.wait_for("stage (b) data:")
    if when == "training":
        _wait_until(lambda: (out / "checkpoints" / "latest").exists(), child)
        _wait_until(lambda: any(p.name.endswith(".tmp") for p in (out / "checkpoints").iterdir()), child)
    child.proc.send_signal(signal.SIGINT)
    assert child.finish() == 130, child.output()[-3000:]
    line = _one_last_line(child.output(), "interrupted: ")
    assert not temp_leftovers(out)
    if when == "building":
        assert "no checkpoint was completed" in line
    else:
        last = resolve_checkpoint(out / "checkpoints" / "latest")
        assert f"the last complete checkpoint is {last} (continue with --resume latest)" in line
        assert check_resume(out, "latest", num_processes=1).path == last


# ---------------------------------------------------------------- file modes


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o027])
def test_every_checkpoint_file_gets_0666_minus_the_umask(tmp_path, umask):
    """safetensors (and peft through it) creates its files 0600: published checkpoints hold none of those."""
    old = os.umask(umask)
    try:
        toy_run(tmp_path, 4, raw_elements=8, keep=10)
    finally:
        os.umask(old)
    modes = _modes(tmp_path)
    assert f"step_0000002/{RAW_SAFETENSORS}" in modes and "step_0000004/model.safetensors" in modes
    for name, mode in modes.items():
        want = 0o777 & ~umask if (tmp_path / "checkpoints" / name).is_dir() else 0o666 & ~umask
        assert mode == want, (name, oct(mode), oct(want))
    shutil.rmtree(tmp_path / "checkpoints")
