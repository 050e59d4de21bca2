"""Stage (d): few-step distillation of the adapted decoder. The 50-step guided teacher -> a K-step (K <= 4) student
that samples without classifier-free guidance (one transformer call per step instead of two).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_d.py \\
        --config configs/stage_d.yaml
    python scripts/train_stage_d.py --config configs/tiny/stage_d.yaml              # tiny models on a laptop CPU
    python scripts/train_stage_d.py --config configs/stage_d.yaml --resume latest   # exact resume

Needs the stage (c) run: ``stage_c_checkpoint`` (the adapted decoder: teacher, and the student's starting point)
and ``conditions`` (the MLLM's predicted s_a of the training clips, stage (c)'s predictions cache); the motion
levels come from ``data.manifest``. No clips are read: the teacher makes every target.

Method: segmented trajectory distillation with a guided teacher ODE target (the teacher-solved variant of phased
consistency distillation, Wang et al. 2024, PCM; the student-rollout inputs follow CausVid / Self-Forcing). The
teacher's sampler (``teacher.steps`` deterministic DDIM steps, its dynamic CFG schedule) is cut into K segments;
one micro-batch draws a segment k (the same on every process, a pure function of the seed and the micro-batch),
walks the student's own sampler from Gaussian noise to the segment's start (no gradient), lets the frozen teacher
solve the guided ODE across the segment from that very point, and regresses the student's one-step jump onto it
in clean-latent units (animegamer.training.distill). Why this one:

- the target is the teacher's actual multi-step guided solution from the same point, not a bootstrap of the
  student (consistency distillation's EMA target) nor a learned critic (DMD2 trains a second "fake score" network
  and a GAN head: two more models in memory and a min-max game, fragile on a LoRA student and a CPU budget);
- one stage and one loss, no schedule of halvings (progressive distillation needs log2(50/4) rounds, each a
  training run of its own);
- the LoRA student starts from the teacher itself and only learns to take longer strides with the guidance
  folded in, a small change a rank-64 LoRA can hold; the loss goes to zero exactly when the student's K-step
  sampler reproduces the teacher's K-segment ODE map, so it is a faithful progress measure.
Cost per step: k student calls (no grad) + up to 2 * ceil(M / K) teacher calls (no grad) + 1 student call with
gradient; at full size about 26 CogVideoX-2B forwards per sample for K = 4, M = 50.

The student keeps the decoder's LoRA + motion embedding layout and trains only those (as stage c). Conditioned on
the same s_a and motion level as the teacher's conditional branch; the unconditional branch is folded away.

Writes output_dir/{config.yaml, run_info.json, metrics.csv | logs/} and
output_dir/checkpoints/step_XXXXXXX/{decoder/ (stage (c)'s layout + sampler.json: the student's timesteps and
its teacher), optimizer + scheduler + RNG state, trainer_state.json}. Play it with the inference config's
``decoder_checkpoint`` pointing at the run and ``sampling.preset=distilled``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from animegamer.cli import fail
from animegamer.config import StageDConfig
from animegamer.data.features import motion_level_of
from animegamer.data.manifest import ManifestError, read_manifest
from animegamer.data.tensor_store import TensorStore
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.trained import DECODER_DIR, load_decoder
from animegamer.sampling.fewstep import SAMPLER_FILE, FewStepSampler, alpha_at, alpha_schedule
from animegamer.sampling.schedule import guidance_scales
from animegamer.training.batches import resumable_batches
from animegamer.training.checkpoint import save_checkpoint, skip_model_weights_in_state
from animegamer.training.distill import (
    ConditionDataset,
    segment_boundaries,
    segment_of,
    student_rollout,
    student_timesteps,
    student_x0,
    target_x0,
    teacher_segment,
)
from animegamer.training.engines import (
    configure_deepspeed,
    gather_trained_state,
    load_resume_weights,
    optimizer_step,
    seed_process,
)
from animegamer.training.optim import build_optimizer, build_scheduler
from animegamer.training.program import releases_output_dir, run_program
from animegamer.training.recipe import resume_point
from animegamer.training.run import build_accelerator, end_run, parse_stage_config, restore, start_run


class Plan:
    """The teacher's timesteps and guidance scales, the segment boundaries, the student's sampler, the noise
    schedule and the latent shape: everything one step needs besides the models and the batch."""

    def __init__(self, cfg: StageDConfig, decoder: AnimationShotDecoder):
        from diffusers import CogVideoXDDIMScheduler

        scheduler = CogVideoXDDIMScheduler.from_config(decoder.scheduler_config)
        scheduler.set_timesteps(cfg.teacher.steps)
        self.teacher_timesteps = [int(t) for t in scheduler.timesteps]
        self.scales = guidance_scales(cfg.teacher)
        self.boundaries = segment_boundaries(cfg.teacher.steps, cfg.student_steps)
        self.times = student_timesteps(self.teacher_timesteps, self.boundaries) + [-1]  # + the clean end
        self.alphas, self.final_alpha = alpha_schedule(decoder.scheduler_config)
        teacher = {k: getattr(cfg.teacher, k) for k in ("steps", "scheduler", "guidance_scale", "dynamic_cfg",
                                                        "dynamic_cfg_exponent", "guidance_steps_fraction")}
        self.sampler = FewStepSampler(tuple(self.times[:-1]), teacher={**teacher, "boundaries": self.boundaries})
        self.latent_shape = latent_shape(cfg, decoder)

    def alpha(self, t: int) -> float:
        return alpha_at(self.alphas, self.final_alpha, t)


def latent_shape(cfg: StageDConfig, decoder: AnimationShotDecoder) -> tuple[int, int, int, int]:
    """(F, C, h, w) of a ``teacher.num_frames`` x ``teacher.height`` x ``teacher.width`` clip, from the VAE's
    config alone (training never loads the VAE)."""
    path = Path(cfg.decoder.pretrained) / "vae" / "config.json"
    try:
        vae = json.loads(path.read_text())
        temporal, spatial = int(vae["temporal_compression_ratio"]), 2 ** (len(vae["block_out_channels"]) - 1)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a CogVideoX VAE config ({exc})") from None
    s = cfg.teacher
    if (s.num_frames - 1) % temporal or s.height % spatial or s.width % spatial:
        raise ValueError(f"teacher: {s.num_frames} frames at {s.height}x{s.width}: need frames = {temporal}k + 1 "
                         f"and sizes divisible by {spatial}")
    channels = decoder.transformer.config.in_channels
    return (s.num_frames - 1) // temporal + 1, channels, s.height // spatial, s.width // spatial


def check_resumed_sampler(checkpoint: Path, plan: Plan, num_train_timesteps: int) -> None:
    """A resume continues the same distillation: the checkpoint's student timesteps and teacher settings must be
    this config's (else one LoRA would be trained on two step plans and its sampler.json would describe only the
    last)."""
    saved = FewStepSampler.load(checkpoint / DECODER_DIR, num_train_timesteps)
    for what, was, now in (("timesteps", saved.timesteps, plan.sampler.timesteps),
                           ("teacher", saved.teacher, plan.sampler.teacher)):
        if was != now:
            raise ValueError(f"{checkpoint / DECODER_DIR / SAMPLER_FILE}: the run distilled {what} {was}, this config "
                             f"gives {now} (student_steps and teacher.* must stay those of the run it resumes)")


def build_teacher(cfg: StageDConfig, device) -> AnimationShotDecoder:
    """The frozen stage (c) decoder, LoRA folded into its weights (it only predicts)."""
    teacher = load_decoder(cfg.stage_c_checkpoint, cfg.decoder, with_vae=False)
    teacher.merge_lora()
    return teacher.requires_grad_(False).to(device).eval()


def build_student(cfg: StageDConfig) -> AnimationShotDecoder:
    """The stage (c) decoder again, its LoRA + motion embedding trainable."""
    return load_decoder(cfg.stage_c_checkpoint, cfg.decoder, with_vae=False).train()


def build_dataset(cfg: StageDConfig) -> tuple[ConditionDataset, list[str]]:
    """Every s_a of ``conditions`` whose clip the manifest gives a motion level; the others are reported."""
    records = read_manifest(cfg.data.manifest).by_id()
    store_dir = Path(cfg.conditions)
    if not (store_dir / "index.json").is_file():
        raise FileNotFoundError(f"conditions: no TensorStore at {store_dir} (stage (c)'s predictions cache)")
    items, left_out = [], []
    for clip_id in TensorStore(store_dir).clip_ids():
        if clip_id not in records:
            left_out.append(f"{clip_id}: not in {cfg.data.manifest}")
            continue
        record = records[clip_id]
        if record.motion_level is None and not record.tags:
            left_out.append(f"{clip_id}: no motion level (neither measured nor tagged)")
            continue
        items.append((clip_id, motion_level_of(record)))
    return ConditionDataset(store_dir, items), left_out


def compute_loss(model, teacher: AnimationShotDecoder, batch: dict, plan: Plan, segment: int) -> torch.Tensor:
    """The stage (d) loss of one micro-batch on segment ``segment``. ``model`` may be wrapped (DDP ...)."""
    shots, levels = batch["shot_embeds"], batch["motion_level"]  # (B, N, H), (B,)
    noise = torch.randn(shots.shape[0], *plan.latent_shape, device=shots.device)  # (B, F, C, h, w)
    start, end = plan.boundaries[segment], plan.boundaries[segment + 1]
    t, t_next = plan.times[segment], plan.times[segment + 1]
    x = student_rollout(model, noise, plan.times, segment, shots, levels, plan.alphas, plan.final_alpha)
    x_end = teacher_segment(teacher, x, start, end, plan.teacher_timesteps, plan.scales, plan.alphas,
                            plan.final_alpha, shots, levels)
    target = target_x0(x, x_end, plan.alpha(t), plan.alpha(t_next))
    prediction = student_x0(model, x, t, shots, levels, plan.alpha(t))
    return torch.nn.functional.mse_loss(prediction, target)


@releases_output_dir
def main(argv: list[str] | None = None) -> Path:
    cfg = parse_stage_config(StageDConfig, __doc__, argv)
    train = cfg.train
    if cfg.teacher.scheduler != "ddim":
        fail(f"teacher.scheduler={cfg.teacher.scheduler!r}: the teacher's ODE is the deterministic DDIM sampler "
             "(teacher.scheduler=ddim); the student's steps walk the same ODE")
    if not 1 <= cfg.student_steps <= cfg.teacher.steps:
        fail(f"student_steps={cfg.student_steps} must be in 1..teacher.steps ({cfg.teacher.steps})")

    accelerator = build_accelerator(cfg.output_dir, train)
    skip_model_weights_in_state(accelerator)
    say = accelerator.print

    # ---- the resume checkpoint, the data, teacher and student: bad input fails here, before anything of the run is
    # written (a failed retry leaves a finished run's files alone) and, for the first two, before a model is built
    try:
        resume = resume_point(cfg, accelerator)
        dataset, left_out = build_dataset(cfg)
        set_seed(cfg.seed)
        student = build_student(cfg)
        teacher = build_teacher(cfg, accelerator.device)
        plan = Plan(cfg, student)
        if resume is not None:
            check_resumed_sampler(resume.path, plan, student.noise_scheduler.config.num_train_timesteps)
    except (ManifestError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))  # CheckpointError is a ValueError
    tcfg = student.transformer.config
    want = (student.num_condition_tokens, tcfg.num_attention_heads * tcfg.attention_head_dim)
    if tuple(dataset[0]["shot_embeds"].shape) != want:
        fail(f"conditions in {cfg.conditions} are s_a of {tuple(dataset[0]['shot_embeds'].shape)}; the decoder "
             f"takes {want}")
    for line in left_out[:20]:
        say(f"left out {line}")
    say(
        f"{len(dataset)} conditions; student {cfg.student_steps} steps at t={plan.times[:-1]} from a "
        f"{cfg.teacher.steps}-step teacher ({sum(s > 1.0 for s in plan.scales)} guided); "
        f"{accelerator.num_processes} process(es); batch {train.batch_size} x {train.grad_accum}"
    )

    # ---- only the student's LoRA + motion embedding are optimised; the teacher is never prepared
    # the resume point's weights before prepare: the engine then shards the restored values
    load_resume_weights(resume, lambda path: student.load_trained(path / DECODER_DIR))
    student.to(accelerator.device)  # before the optimizer: AdamW is fused on CUDA
    optimizer = build_optimizer(student.trainable_parameters(), train)
    lr_scheduler = build_scheduler(optimizer, train)
    configure_deepspeed(accelerator, train)
    model, optimizer, lr_scheduler = accelerator.prepare(student, optimizer, lr_scheduler)
    core = accelerator.unwrap_model(model)
    trained = [p for p in model.parameters() if p.requires_grad]  # after prepare: the engine's own parameters

    def checkpoint(at_step: int, logs: dict) -> Path:
        # every process takes part in gathering; the main one writes
        state = gather_trained_state(core, accelerator.is_main_process)

        def save_weights(path: Path) -> None:
            core.save_trained(path / DECODER_DIR, state)
            plan.sampler.save(path / DECODER_DIR)

        return save_checkpoint(accelerator, cfg.output_dir, at_step, save_weights, logs, keep=train.keep_checkpoints)

    # ---- resume: optimizer, lr schedule and every process's RNG (the weights: loaded above); the data order is a
    # function of the step
    seed_process(cfg.seed, accelerator)  # the noise differs per process; the segment is the same on all
    step = restore(accelerator, resume, lambda _path: None, train.allow_rng_reset)  # the weights: loaded above
    out = start_run(accelerator, cfg, "stage_d", resume)
    batches = resumable_batches(dataset, accelerator, train, cfg.seed, step, cfg.data.num_workers)

    # ---- loop
    progress = tqdm(total=train.max_steps, initial=step, desc="stage d", disable=not accelerator.is_main_process)
    loss_value = float("nan")
    # the segments' losses differ by orders of magnitude (the first, from pure noise, is the hardest): each one's
    # mean over the logging interval is logged beside the step's loss
    segment_sums = torch.zeros(cfg.student_steps, device=accelerator.device)
    segment_counts = torch.zeros(cfg.student_steps, device=accelerator.device)
    while step < train.max_steps:
        step_loss = torch.zeros((), device=accelerator.device)
        for micro in range(train.grad_accum):
            batch = {k: v.to(accelerator.device, non_blocking=True) for k, v in next(batches).items()}
            segment = segment_of(cfg.seed, step * train.grad_accum + micro, cfg.student_steps)
            with accelerator.accumulate(model):
                loss = compute_loss(model, teacher, batch, plan, segment)
                accelerator.backward(loss)
            step_loss += loss.detach() / train.grad_accum
            segment_sums[segment] += loss.detach()
            segment_counts[segment] += 1
        lr = lr_scheduler.get_last_lr()[0]  # the rate this step applies
        grad_norm = optimizer_step(accelerator, model, optimizer, lr_scheduler, trained, train.max_grad_norm)
        step += 1

        progress.update(1)
        if step % train.log_every == 0 or step == train.max_steps:
            loss_value = accelerator.reduce(step_loss, "mean").item()
            sums, counts = accelerator.reduce(segment_sums, "sum"), accelerator.reduce(segment_counts, "sum")
            per_segment = {f"loss_segment_{k}": (sums[k] / counts[k]).item() for k in range(cfg.student_steps)
                           if counts[k] > 0}
            segment_sums.zero_()
            segment_counts.zero_()
            accelerator.log(
                {
                    "loss": loss_value,
                    **per_segment,
                    "grad_norm": grad_norm,
                    "lr": lr,
                },
                step=step,
            )
            progress.set_postfix(loss=f"{loss_value:.4f}")
        if step % train.checkpoint_every == 0 or step == train.max_steps:
            checkpoint(step, {"loss": loss_value, "sampler_timesteps": list(plan.sampler.timesteps)})
    progress.close()
    accelerator.wait_for_everyone()
    end_run(accelerator)
    say(f"done: {step} steps; checkpoints in {out / 'checkpoints'}")
    return out


if __name__ == "__main__":
    run_program(main)
