"""Every training stage under DDP (gloo) and DeepSpeed ZeRO-3 on 2 CPU processes (its CPU accelerator, gloo), stages
(a) and (b) also under ZeRO-2 and stage (b) under ZeRO-3 with optimizer and parameters offloaded to the CPU, write
the same trained weights from the same seed, a killed ZeRO-2 run resumes into the uninterrupted one, and a launch
whose processes
accelerate cannot see stops before it writes anything. Each stage has one DDP reference run that every engine of
that stage is compared with.

Tolerance of the engine comparison: atol 1e-5 + rtol 1e-4 on weights after 2 optimizer steps. DDP all-reduces and
averages the gradients in buckets, ZeRO-2/3 reduce-scatter them in partitions, and each computes the clipping norm
as a sum over its own pieces: the same float32 numbers added in another order, which differ by a few ulps
(~1e-7 relative). AdamW's first steps move a weight by about lr * g / (|g| + eps) = 1e-3 per step whatever the
gradient's scale, so a 1e-7 relative change of g moves a weight by far less than 1e-5; a real engine bug (a missed
gradient average, an unscaled shard, an unclipped step, a ZeRO-3 placeholder saved) moves it by the size of a whole
step (~1e-3) or leaves it at its initial value. Where a gradient entry is near AdamW's eps (1e-8) its step is no
longer scale-free and the reordering shows more: the largest difference seen is 1.7e-5 on a stage (b) resampler
weight of 0.117, inside atol + rtol * |w| = 2.2e-5. The resume comparison is exact where the engine is: the same
engine, the same partitions, the same order.
"""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from animegamer.data.tensor_store import TensorStore
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.weights import load_state_dict_file
from animegamer.recipes import stage_a, train_stage
from animegamer.sampling.fewstep import SAMPLER_FILE
from tests.helpers.stage_runs import (
    STAGE_A_CONFIG,
    STAGE_B_CONFIG,
    STAGE_C_CONFIG,
    STAGE_D_CONFIG,
    stage_b_overrides,
)
from tests.helpers.stage_scripts import free_port, launch_engine, logged_losses

ROOT = Path(__file__).resolve().parents[1]
ATOL, RTOL = 1e-5, 1e-4
STEPS = ["train.max_steps=2", "train.checkpoint_every=1", "train.keep_checkpoints=0", "train.log_every=1",
         "train.batch_size=1"]


def trained_weights(step_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` a stage wrote into a checkpoint (its trained parts; accelerate's and
    DeepSpeed's own state is in other files), keyed ``relative/path.safetensors:name``."""
    out = {}
    for path in sorted(step_dir.rglob("*.safetensors")):
        for name, value in load_state_dict_file(path).items():
            out[f"{path.relative_to(step_dir)}:{name}"] = value
    return out


def stage_argv(stage: str, fixtures: dict, tmp_path: Path, out: Path) -> list[str]:
    """The arguments of a tiny run of ``stage`` into ``out``."""
    if stage == "a":
        return ["--config", str(STAGE_A_CONFIG), *fixtures["stage_a_data"]["overrides"], f"output_dir={out}",
                "train.report_to=csv", "warmup_steps=1"]  # step 1 warms the encoder up, step 2 trains jointly
    if stage == "b":
        return ["--config", str(STAGE_B_CONFIG),
                *stage_b_overrides(tmp_path, fixtures["tiny_mistral_dir"], out), "data.history_turns=1"]
    if stage == "c":  # one predictions cache: the first run fills it, the others only train
        return ["--config", str(STAGE_C_CONFIG), *fixtures["stage_c_runs"]["overrides"], f"output_dir={out}",
                f"predictions_cache={tmp_path / 'predictions'}"]
    return ["--config", str(STAGE_D_CONFIG), *fixtures["stage_d_run"]["overrides"], f"output_dir={out}"]


SCRIPTS = {"a": "train_stage_a", "b": "train_stage_b", "c": "train_stage_c", "d": "train_stage_d"}
FIXTURES = {"a": ["stage_a_data"], "b": ["tiny_mistral_dir"], "c": ["stage_c_runs"], "d": ["stage_d_run"]}


def launched(engine: str, stage: str, argv: list[str], out: Path) -> Path:
    """Run ``stage`` under ``engine`` on 2 CPU processes; checks it ran as one 2-process run. Returns ``out``."""
    result = launch_engine(engine, SCRIPTS[stage], argv)
    assert result.returncode == 0, f"{engine} stage {stage}:\n{result.stderr[-4000:]}"
    info = json.loads((out / "run_info.json").read_text())
    assert info["num_processes"] == 2
    want = "DistributedType.MULTI_CPU" if engine == "ddp" else "DistributedType.DEEPSPEED"
    assert info["distributed_type"] == want
    if engine in ZERO:  # the engine ran as its accelerate config says: ZeRO stage, offload of optimizer and weights
        zero_stage, offload = ZERO[engine]
        assert info["deepspeed"] == {"zero_stage": zero_stage, "offload_optimizer": offload, "offload_param": offload}
    return out


def assert_close(got: dict, want: dict, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    assert got.keys() == want.keys(), what
    for key in want:
        assert got[key].shape == want[key].shape, f"{what}: {key}"
        torch.testing.assert_close(got[key], want[key], atol=atol, rtol=rtol, msg=lambda m, k=key: f"{what}: {k}\n{m}")


# ZeRO-3 with CPU offload (optimizer state and parameters): stage (b), the stage its config is shipped for (a 7B
# MLLM with LoRA on one GPU), and the one whose model is built inside DeepSpeed's zero.Init by transformers
# ZeRO-2 (a partitioned optimizer over whole weights, nothing stage-specific) and its killed-and-resumed run:
# stages (a) (the decoder side) and (b) (the MLLM side). ZeRO-3 (partitioned weights, which each stage's save path
# must gather, and stage (d)'s frozen teacher) and DDP: every stage. Restoring the weights, the partitioned optimizer,
# every rank's RNG and the data order is the shared loop's (animegamer/training/loop.py), the same for (c) and (d),
# whose own resumes are exact in tests/test_stage_c.py and tests/test_stage_d.py. Each 2-process launch costs about
# 20 s of imports here (torch, diffusers, peft, transformers, DeepSpeed in every process); these four would add
# about 100 s of CI and no code path.
ENGINE_CASES = [
    pytest.param("a", ("ddp", "zero2", "zero3"), True, id="a"),
    pytest.param("b", ("ddp", "zero2", "zero3", "zero3_offload"), True, id="b"),
    pytest.param("c", ("ddp", "zero3"), False, id="c"),
    pytest.param("d", ("ddp", "zero3"), False, id="d"),
]
ZERO = {"zero2": (2, "none"), "zero3": (3, "none"), "zero3_offload": (3, "cpu")}


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "engines", "resume"), ENGINE_CASES)
def test_engines_write_the_same_weights_and_zero2_resumes_exactly(stage, engines, resume, request, tmp_path, capsys):
    """DDP and DeepSpeed from the same seed write the same trained weights at steps 1 and 2; with ``resume``, a
    ZeRO-2 run killed after step 1's checkpoint and resumed writes exactly the uninterrupted run's step 2, and
    resumed on one process (which cannot load its partitioned optimizer state) is refused in one line before
    DeepSpeed runs, even with ``train.allow_recipe_change=true``."""
    fixtures = {name: request.getfixturevalue(name) for name in FIXTURES[stage]}
    done = {}
    for engine in engines:
        out = tmp_path / engine
        done[engine] = launched(engine, stage, [*stage_argv(stage, fixtures, tmp_path, out), *STEPS], out)
    ddp = {step: trained_weights(done["ddp"] / "checkpoints" / f"step_000000{step}") for step in (1, 2)}
    assert ddp[2] and all(t.isfinite().all() for t in ddp[2].values())
    # one run of two processes: every rank's random state saved, the losses logged once per step, and what the
    # stage writes beside its weights (stage (a): the shot targets of every clip; stage (d): the student's sampler)
    final = done["ddp"] / "checkpoints" / "step_0000002"
    assert (final / "random_states_0.pkl").is_file() and (final / "random_states_1.pkl").is_file()
    losses = logged_losses(done["ddp"])
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    if stage == "a":
        assert len(TensorStore(done["ddp"] / "shot_targets")) == 4
    if stage == "d":
        assert (final / "decoder" / SAMPLER_FILE).is_file()
    moved = [k for k in ddp[2] if not torch.allclose(ddp[2][k], ddp[1][k], atol=1e-4, rtol=0)]
    assert moved, "nothing trained in step 2: the comparison would prove nothing"
    for engine in engines[1:]:
        for step in (1, 2):
            got = trained_weights(done[engine] / "checkpoints" / f"step_000000{step}")
            assert_close(got, ddp[step], f"{engine} vs ddp, step {step}, stage {stage}")

    if not resume:
        return
    # killed after step 1's checkpoint: what the uninterrupted ZeRO-2 run had on disk then
    killed = tmp_path / "killed"
    shutil.copytree(done["zero2"], killed)
    shutil.rmtree(killed / "checkpoints" / "step_0000002")
    (killed / "checkpoints" / "latest").write_text("step_0000001\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # this process: one process, no DeepSpeed
        train_stage(f"stage_{stage}", [*stage_argv(stage, fixtures, tmp_path, killed), *STEPS,
                                       "train.allow_recipe_change=true", "train.resume=latest"])
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    assert "saved by 2 process(es) under DeepSpeed ZeRO-2; this run has 1 process(es)" in err[-1], err
    launched("zero2", stage, [*stage_argv(stage, fixtures, tmp_path, killed), *STEPS, "--resume", "latest"], killed)
    resumed = trained_weights(killed / "checkpoints" / "step_0000002")
    uninterrupted = trained_weights(done["zero2"] / "checkpoints" / "step_0000002")
    assert_close(resumed, uninterrupted, f"resumed zero2, stage {stage}", atol=0, rtol=0)


@pytest.mark.parametrize("stage", ["a", "b", "c", "d"])
def test_a_launch_accelerate_cannot_see_stops_before_writing(stage, tmp_path, monkeypatch, capsys):
    """The launcher's WORLD_SIZE above the processes accelerate sees (its FSDP plugin on CPUs runs each process
    alone): one ``error:`` line, exit code 2, no output directory."""
    config = {"a": STAGE_A_CONFIG, "b": STAGE_B_CONFIG, "c": STAGE_C_CONFIG, "d": STAGE_D_CONFIG}[stage]
    out = tmp_path / "run"
    monkeypatch.setenv("WORLD_SIZE", "2")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        train_stage(f"stage_{stage}", ["--config", str(config), f"output_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: the launcher started 2 processes") and "\n" not in err
    assert not out.exists()


def test_fsdp_on_cpu_processes_is_refused_by_every_process(stage_d_run, tmp_path):
    """The real case: the shipped FSDP config launched on 2 CPU processes."""
    out = tmp_path / "fsdp"
    argv = [*stage_argv("d", {"stage_d_run": stage_d_run}, tmp_path, out), *STEPS]
    result = launch_engine("ddp", "train_stage_d", argv, config_file="fsdp_decoder.yaml")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and all("launcher started 2 processes (WORLD_SIZE)" in e for e in errors), errors
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["decoder", "mllm"])
def test_fsdp2_saves_gather_full_weights_and_resume_continues_exactly(kind, request, tmp_path):
    """torch's FSDP2 (``fully_shard``) on a 2-process gloo group, where accelerate's FSDP plugin cannot start, for
    the decoder of stages (a), (c), (d) and the MLLM of stage (b): the stages' save path writes the full trained parts
    (equal to an unsharded copy trained on the same global batch, float32 tolerance as above: the gradient average
    is a reduce-scatter instead of one sum) and a resume from step 1 (weights loaded before sharding, the optimizer
    state into the sharded optimizer) writes step 2 exactly."""
    pretrained = request.getfixturevalue({"decoder": "tiny_cogvideox_dir", "mllm": "tiny_mistral_dir"}[kind])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(ROOT / "tests" / "helpers" / "fsdp2_worker.py"), kind, str(pretrained), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    step_1, step_2 = (trained_weights(tmp_path / f"fsdp_step_{s}") for s in (1, 2))
    plain = trained_weights(tmp_path / "plain_step_2")
    assert step_2.keys() == plain.keys() and any("lora_B" in k for k in plain)
    parts = {"decoder": ["motion"], "mllm": ["new_token_embed", "new_token_head", "input_resampler",
                                            "output_resampler"]}[kind]
    assert all(any(part in k for k in plain) for part in parts), sorted(plain)
    assert all(step_2[k].shape == plain[k].shape for k in plain)  # full tensors, not one process's shard
    assert any(not torch.equal(step_1[k], step_2[k]) for k in plain)
    assert_close(step_2, plain, f"fsdp2 vs unsharded, {kind}")
    assert_close(trained_weights(tmp_path / "resumed_step_2"), step_2, f"resumed fsdp2, {kind}", atol=0, rtol=0)


@pytest.mark.gpu
def test_stage_a_trains_under_accelerates_fsdp2_on_one_gpu(stage_a_data, tmp_path):
    """The shipped FSDP2 config end to end through accelerate (one process: its plugin needs a GPU): a 2-step run
    writes full trained parts (the shapes of an unsharded model's) and its checkpoint resumes."""
    out = tmp_path / "fsdp"
    argv = [*stage_argv("a", {"stage_a_data": stage_a_data}, tmp_path, out), *STEPS]
    result = launch_engine("ddp", "train_stage_a", argv, num_processes=1, config_file="fsdp_decoder.yaml")
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads((out / "run_info.json").read_text())["distributed_type"] == "DistributedType.FSDP"
    step_1, step_2 = (trained_weights(out / "checkpoints" / f"step_000000{s}") for s in (1, 2))
    plain = stage_a
    reference = plain.EncoderDecoder(
        ActionAwareEncoder.from_config(stage_a_data["cfg"].encoder),
        AnimationShotDecoder.from_config(stage_a_data["cfg"].decoder, with_vae=False),
    )
    shapes = {name: tuple(p.shape) for name, p in reference.named_parameters() if p.requires_grad}
    assert len(step_2) == len(shapes) and sorted(tuple(v.shape) for v in step_2.values()) == sorted(shapes.values())
    assert any(not torch.equal(step_1[k], step_2[k]) for k in step_2)
    resumed = launch_engine("ddp", "train_stage_a", [*argv, "train.max_steps=3", "--resume", "latest"],
                            num_processes=1, config_file="fsdp_decoder.yaml")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert (out / "checkpoints" / "step_0000003").is_dir()
