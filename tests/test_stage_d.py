"""Stage (d): the distillation pieces (teacher segments, target, student step), a real tiny run, resume, configs."""

import csv
import json
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from animegamer.config import SamplingConfig, load_config
from animegamer.data import stage_d as stage_d_data
from animegamer.models.trained import load_decoder
from animegamer.models.weights import load_state_dict_file
from animegamer.recipes import stage_d as train_stage_d
from animegamer.sampling.denoise import sample, start_sampling
from animegamer.sampling.fewstep import SAMPLER_FILE, FewStepSampler, alpha_schedule, ddim_step, fewstep_sample
from animegamer.sampling.schedule import guidance_scales
from animegamer.training.checkpoint import list_checkpoints
from animegamer.training.distill import (
    segment_boundaries,
    student_timesteps,
    target_x0,
    teacher_segment,
)
from tests.helpers.stage_runs import DECODER_SLOTS as SLOTS
from tests.helpers.stage_runs import SHOT_DIM
from tests.helpers.stage_runs import STAGE_D_CONFIG as TINY_CONFIG
from tests.helpers.stage_runs import STAGE_D_UNCAPTIONED as UNCAPTIONED
from tests.helpers.stage_scripts import (
    ROOT,
    check_bad_resumes_leave_the_run_alone,
    logged_losses,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]




def _argv(run, out: Path, *extra: str) -> list[str]:
    return ["--config", str(TINY_CONFIG), *run["overrides"], f"output_dir={out}", *extra]


# ---------------------------------------------------------------- pure pieces


def test_segments_and_student_timesteps():
    assert segment_boundaries(50, 4) == [0, 12, 25, 38, 50]
    assert segment_boundaries(8, 8) == list(range(9)) and segment_boundaries(8, 1) == [0, 8]
    with pytest.raises(ValueError, match="student_steps=5"):
        segment_boundaries(4, 5)
    teacher = [999, 749, 499, 249]
    assert student_timesteps(teacher, segment_boundaries(4, 2)) == [999, 499]


def test_target_x0_is_what_the_ddim_jump_needs():
    g = torch.Generator().manual_seed(0)
    x, x_end = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    for alpha, alpha_next in ((0.0, 0.3), (0.2, 0.9), (0.5, 1.0)):
        x0 = target_x0(x, x_end, alpha, alpha_next)
        torch.testing.assert_close(ddim_step(x, x0, alpha, alpha_next), x_end)
    with pytest.raises(ValueError, match="less noise"):
        target_x0(x, x_end, 0.5, 0.4)


def test_teacher_segment_is_the_decoders_guided_ddim_sampler(stage_d_run):
    """The whole teacher trajectory as one segment equals sampling.denoise.sample with the DDIM scheduler."""
    decoder = load_decoder(stage_d_run["stage_c"], stage_d_run["decoder_cfg"])
    # 4 steps: 1000 is a multiple, so diffusers' DDIM steps walk the grid too (as with the paper's 50)
    sampling = SamplingConfig(scheduler="ddim", steps=4, height=64, width=96, num_frames=5, guidance_scale=4.0)
    g = torch.Generator().manual_seed(3)
    shots, levels = torch.randn(2, SLOTS, SHOT_DIM, generator=g), torch.tensor([2, 5])
    reference = sample(decoder, shots, levels, sampling, generator=torch.Generator().manual_seed(7), decode=False)
    scheduler, scales, latents = start_sampling(decoder, 2, sampling, torch.Generator().manual_seed(7))
    alphas, final_alpha = alpha_schedule(decoder.scheduler_config)
    timesteps = [int(t) for t in scheduler.timesteps]
    assert scales == guidance_scales(sampling) and scales[0] > 1.0
    halves = teacher_segment(decoder, latents, 0, 2, timesteps, scales, alphas, final_alpha, shots, levels)
    whole = teacher_segment(decoder, halves, 2, 4, timesteps, scales, alphas, final_alpha, shots, levels)
    torch.testing.assert_close(whole, reference, rtol=1e-4, atol=1e-4)
    # the few-step sampler at all the teacher's timesteps is the same walk without guidance
    unguided = SamplingConfig(scheduler="ddim", steps=4, height=64, width=96, num_frames=5, guidance_scale=1.0)
    plain = sample(decoder, shots, levels, unguided, generator=torch.Generator().manual_seed(7), decode=False)
    fewstep = fewstep_sample(decoder, shots, levels, FewStepSampler(tuple(timesteps)), latents)
    torch.testing.assert_close(fewstep, plain, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain, reference, atol=1e-3)  # guidance does change the teacher's clip


def test_sampler_record_round_trip_and_validation(tmp_path):
    sampler = FewStepSampler((999, 759, 499, 239), teacher={"steps": 50})
    sampler.save(tmp_path)
    assert FewStepSampler.load(tmp_path, 1000) == sampler and sampler.steps == 4
    bad = {"format": "animegamer-fewstep-v1", "timesteps": [499, 999]}
    (tmp_path / SAMPLER_FILE).write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="decreasing integers"):
        FewStepSampler.load(tmp_path, 1000)
    (tmp_path / SAMPLER_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        FewStepSampler.load(tmp_path, 1000)
    with pytest.raises(FileNotFoundError, match="stage \\(d\\)"):
        FewStepSampler.load(tmp_path / "none", 1000)


# ---------------------------------------------------------------- the script


def test_loss_falls_on_a_fixed_batch(stage_d_run):
    cfg = load_config(TINY_CONFIG, _argv(stage_d_run, stage_d_run["root"] / "unused")[2:])
    dataset, left_out = stage_d_data.build_dataset(cfg)
    assert len(dataset) == 3 and left_out == [f"{UNCAPTIONED}: no motion level (neither measured nor tagged)"]
    batch = {k: torch.stack([dataset[i][k] for i in range(3)]) for k in dataset[0]}
    student, teacher = train_stage_d.build_student(cfg), train_stage_d.build_teacher(cfg, "cpu")
    plan = train_stage_d.Plan(cfg, student)
    assert plan.latent_shape == (2, 4, 8, 12) and plan.boundaries == [0, 4, 8] and plan.times[-1] == -1
    optimizer = torch.optim.AdamW(student.trainable_parameters(), lr=1e-2)
    frozen = {n: p.clone() for n, p in student.named_parameters() if not p.requires_grad}
    for segment in (0, 1):  # both segments of the 2-step student
        losses = []
        for _ in range(8):
            torch.manual_seed(1)  # the same noise every step: one fixed batch to fit
            loss = train_stage_d.compute_loss(student, teacher, batch, plan, segment=segment)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert all(torch.isfinite(torch.tensor(losses))), losses
        assert all(b < a for a, b in pairwise(losses)) and losses[-1] < 0.9 * losses[0], (segment, losses)
    assert all(torch.equal(p, frozen[n]) for n, p in student.named_parameters() if not p.requires_grad)
    assert not any(p.requires_grad for p in teacher.parameters())


def test_run_writes_a_decoder_checkpoint_and_resumes_exactly(stage_d_run, tmp_path, capsys):
    common = ["train.checkpoint_every=1", "train.keep_checkpoints=10"]
    straight = train_stage_d.main(_argv(stage_d_run, tmp_path / "a", *common, "train.max_steps=3"))
    steps = list_checkpoints(straight)
    assert [p.name for p in steps] == ["step_0000001", "step_0000002", "step_0000003"]
    for name in ("adapter_model.safetensors", "motion_embedding.safetensors", "decoder_config.json", SAMPLER_FILE):
        assert (steps[-1] / "decoder" / name).is_file(), name
    losses = logged_losses(straight)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    rows = list(csv.DictReader(open(straight / "metrics.csv")))
    segments = [r for r in rows if r["name"].startswith("loss_segment_")]
    assert len(segments) == 3 and {r["name"] for r in segments} <= {"loss_segment_0", "loss_segment_1"}
    for r in segments:  # log_every=1: each step's one segment loss is the step's loss
        assert float(r["value"]) == pytest.approx(losses[int(r["step"]) - 1], rel=1e-6)
    speed = [float(r["value"]) for r in rows if r["name"] == "steps_per_s"]  # every logged step, checkpoints in
    assert len(speed) == 3 and all(v > 0 for v in speed)
    state = json.loads((steps[-1] / "trainer_state.json").read_text())
    assert state["step"] == 3 and len(state["sampler_timesteps"]) == 2
    # the student is a decoder checkpoint like any other, with its sampler recorded
    cfg = load_config(TINY_CONFIG, _argv(stage_d_run, straight)[2:])
    load_decoder(steps[-1], cfg.decoder, with_vae=False)  # the inference loader takes it
    sampler = FewStepSampler.load(steps[-1] / "decoder", 1000)
    assert sampler.timesteps == tuple(state["sampler_timesteps"]) and sampler.teacher["steps"] == 8
    start = load_state_dict_file(stage_d_run["stage_c"] / "checkpoints/step_0000003/decoder/adapter_model.safetensors")
    final = load_state_dict_file(steps[-1] / "decoder" / "adapter_model.safetensors")
    assert start.keys() == final.keys() and any(not torch.equal(start[k], final[k]) for k in start)

    train_stage_d.main(_argv(stage_d_run, tmp_path / "b", *common, "train.max_steps=2"))
    resumed = train_stage_d.main(
        _argv(stage_d_run, tmp_path / "b", *common, "train.max_steps=3", "--resume", "latest")
    )
    assert "resumed from" in capsys.readouterr().out
    # another step plan is another recipe; allowed, it still cannot continue this run
    for allow, needle in [("false", "student_steps 2 -> 4"), ("true", "the run distilled timesteps")]:
        with pytest.raises(SystemExit) as exit_info:
            train_stage_d.main(_argv(stage_d_run, tmp_path / "b", *common, "train.max_steps=4", "student_steps=4",
                                     f"train.allow_recipe_change={allow}", "--resume", "latest"))
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and needle in err and "\n" not in err, err
    again = load_state_dict_file(list_checkpoints(resumed)[-1] / "decoder" / "adapter_model.safetensors")
    for k, v in final.items():
        torch.testing.assert_close(again[k], v, rtol=0, atol=1e-6, msg=k)
    assert logged_losses(resumed)[-1] == pytest.approx(losses[-1], abs=1e-6)  # step 3's loss, after the resume


def test_a_two_step_student_learns_and_renders_in_two_calls(stage_d_run, tmp_path):
    """The recipe of configs/spriteworld/stage_d.yaml (the shipped student) at tiny size: a 2-step student's loss
    falls over a real run (each segment's own loss, first logged vs last), and its checkpoint samples a clip in 2
    transformer calls."""
    out = train_stage_d.main(_argv(stage_d_run, tmp_path / "d2", "student_steps=2", "train.max_steps=16",
                                   "train.lr=1.0e-2", "train.log_every=1", "train.checkpoint_every=16"))
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    values = {k: [float(r["value"]) for r in rows if r["name"] == f"loss_segment_{k}"] for k in (0, 1)}
    assert all(len(v) >= 3 and np.isfinite(v).all() for v in values.values()), values
    # the noise differs every step, so a run's loss is noisy: the hard segment (from pure noise) falls clearly;
    # both segments fall on a fixed batch (test_loss_falls_on_a_fixed_batch)
    assert np.mean(values[0][-2:]) < 0.95 * np.mean(values[0][:2]), values
    checkpoint = list_checkpoints(out)[-1]
    cfg = load_config(TINY_CONFIG, _argv(stage_d_run, out)[2:])
    student = load_decoder(checkpoint, cfg.decoder, with_vae=False)
    sampler = FewStepSampler.load(checkpoint / "decoder", student.noise_scheduler.config.num_train_timesteps)
    assert sampler.steps == 2 and sampler.timesteps == (999, 499)  # the 8-step teacher's steps 0 and 4
    calls = []
    hook = student.transformer.register_forward_hook(lambda *_: calls.append(1))
    shots = torch.randn(1, SLOTS, SHOT_DIM, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(1, 2, 4, 8, 12, generator=torch.Generator().manual_seed(1))  # (B, F, C, h, w)
    latents = fewstep_sample(student, shots, torch.tensor([2]), sampler, noise)
    hook.remove()
    assert len(calls) == 2 and latents.shape == noise.shape and torch.isfinite(latents).all()


def test_spriteworld_other_students_are_stage_d_with_other_segment_counts():
    """stage_d.yaml ships the 2-step student; stage_d4.yaml / stage_d1.yaml are its recipe (teacher, data, budget,
    seed) with 4 / 1 segments; the full-size recipe keeps 4."""
    shipped = load_config(ROOT / "configs/spriteworld/stage_d.yaml")
    assert shipped.student_steps == 2 and load_config(ROOT / "configs/stage_d.yaml").student_steps == 4
    for name, steps in (("stage_d4", 4), ("stage_d1", 1)):
        other = load_config(ROOT / "configs/spriteworld" / f"{name}.yaml")
        assert other.student_steps == steps and other.output_dir == f"outputs/spriteworld/{name}"
        assert (other.teacher, other.train, other.decoder, other.data) == (shipped.teacher, shipped.train,
                                                                          shipped.decoder, shipped.data)
        assert (other.stage_c_checkpoint, other.conditions, other.seed) == (shipped.stage_c_checkpoint,
                                                                            shipped.conditions, shipped.seed)


def test_user_mistakes_exit_2_with_one_line(stage_d_run, tmp_path, capsys):
    cases = {
        "teacher.scheduler=dpm": "teacher.scheduler='dpm'",
        "student_steps=9": "student_steps=9",
        f"conditions={tmp_path / 'none'}": "no TensorStore",
        f"stage_c_checkpoint={tmp_path / 'nowhere'}": "not found",
        "teacher.height=60": "divisible",
        "student_steps=two": "student_steps",
    }
    for override, message in cases.items():
        with pytest.raises(SystemExit) as exc:
            train_stage_d.main(_argv(stage_d_run, tmp_path / "bad", override))
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and err[-1].startswith("error: ") and message in err[-1], (override, err)
    assert not (tmp_path / "bad").exists()  # nothing written before the checks pass
    with pytest.raises(SystemExit) as exc:
        train_stage_d.main(["--help"])
    assert exc.value.code == 0 and "student_steps" in capsys.readouterr().out


def test_configs_line_up_with_stage_c():
    for stage_d, stage_c in (("stage_d.yaml", "stage_c.yaml"), ("tiny/stage_d.yaml", "tiny/stage_c.yaml")):
        d, c = load_config(ROOT / "configs" / stage_d), load_config(ROOT / "configs" / stage_c)
        assert d.decoder == c.decoder and d.data.manifest == c.data.manifest
        assert d.stage_c_checkpoint == f"{c.output_dir}/checkpoints/latest"
        assert d.conditions == f"{c.output_dir}/predictions"
        assert d.student_steps == 4 and d.teacher.scheduler == "ddim"
    paper = load_config(ROOT / "configs" / "stage_d.yaml")
    assert (paper.teacher.steps, paper.teacher.guidance_scale, paper.teacher.num_frames) == (50, 6.0, 17)


def test_a_bad_resume_fails_in_one_line_and_leaves_the_finished_run_alone(stage_d_run, tmp_path, capsys):
    out = train_stage_d.main(_argv(stage_d_run, tmp_path / "done", "train.max_steps=1", "train.checkpoint_every=1"))
    check_bad_resumes_leave_the_run_alone(
        train_stage_d.main, lambda *extra: _argv(stage_d_run, out, *extra), out, capsys
    )


def test_resume_without_an_rng_state_needs_allow_rng_reset(stage_d_run, tmp_path, capsys):
    out = train_stage_d.main(_argv(stage_d_run, tmp_path / "done", "train.max_steps=1", "train.checkpoint_every=1"))
    (out / "checkpoints" / "step_0000001" / "random_states_0.pkl").unlink()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        train_stage_d.main(_argv(stage_d_run, out, "train.max_steps=2", "--resume", "latest"))
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "train.allow_rng_reset=true" in err and "\n" not in err, err
    train_stage_d.main(
        _argv(stage_d_run, out, "train.max_steps=2", "train.allow_rng_reset=true", "--resume", "latest")
    )
    assert "not an exact resume" in capsys.readouterr().err
    info = json.loads((out / "run_info.json").read_text())
    assert info["resumed_step"] == 1 and "random_states_0.pkl is missing" in info["rng_reset"]
    assert [p.name for p in list_checkpoints(out)] == ["step_0000001", "step_0000002"]


def test_shipped_spriteworld_student_renders_in_two_calls():
    """The 2-step student shipped in checkpoints/spriteworld/stage_d (``make demo-fast``) loads through the game's
    renderer and samples a clip in 2 CFG-free transformer calls, at the timesteps its recipe's teacher gives."""
    from animegamer.game.build import load_renderer

    cfg = load_config("configs/spriteworld/inference.yaml",
                      ["sampling.preset=distilled", "decoder_checkpoint=checkpoints/spriteworld/stage_d"])
    renderer = load_renderer(cfg, "cpu", offload=False)
    calls = []
    hook = renderer.decoder.transformer.register_forward_hook(lambda *_: calls.append(1))
    steps = []
    shot = torch.randn(cfg.mllm.num_slots, cfg.mllm.shot_dim, generator=torch.Generator().manual_seed(0))
    frames = renderer.render(shot, 3, seed=0, progress=lambda stage, done: steps.append(stage))
    hook.remove()
    assert len(calls) == 2 and [s for s in steps if s.startswith("denoising")][-1] == "denoising 2/2"
    recipe = load_config(ROOT / "configs/spriteworld/stage_d.yaml")
    assert renderer.sampler.fewstep.steps == recipe.student_steps == 2
    assert frames.shape == (cfg.sampling.num_frames, cfg.sampling.height, cfg.sampling.width, 3)
    assert frames.dtype == np.uint8 and frames.std() > 5  # a picture, not a flat frame
