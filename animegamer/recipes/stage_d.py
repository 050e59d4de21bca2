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

from animegamer.config import StageDConfig
from animegamer.data import stage_d as data
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.trained import DECODER_DIR, load_decoder
from animegamer.sampling.fewstep import SAMPLER_FILE, FewStepSampler, alpha_at, alpha_schedule
from animegamer.sampling.schedule import guidance_scales
from animegamer.training.distill import (
    segment_boundaries,
    segment_of,
    student_rollout,
    student_timesteps,
    student_x0,
    target_x0,
    teacher_segment,
)
from animegamer.training.loop import Recipe, train


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


class StageD(Recipe):
    """Stage (d): the student's LoRA + motion embedding learn one segment of the teacher's ODE per micro-batch; the
    teacher is never prepared."""

    config_class = StageDConfig
    project = "stage_d"

    def check(self) -> None:
        cfg = self.cfg
        if cfg.teacher.scheduler != "ddim":
            raise ValueError(f"teacher.scheduler={cfg.teacher.scheduler!r}: the teacher's ODE is the deterministic "
                             "DDIM sampler (teacher.scheduler=ddim); the student's steps walk the same ODE")
        if not 1 <= cfg.student_steps <= cfg.teacher.steps:
            raise ValueError(f"student_steps={cfg.student_steps} must be in 1..teacher.steps ({cfg.teacher.steps})")

    def build(self, resume) -> None:
        cfg, accelerator = self.cfg, self.accelerator
        self.dataset, left_out = data.build_dataset(cfg)
        set_seed(cfg.seed)
        self.model = build_student(cfg)
        self.teacher = build_teacher(cfg, accelerator.device)
        self.plan = plan = Plan(cfg, self.model)
        if resume is not None:
            check_resumed_sampler(resume.path, plan, self.model.noise_scheduler.config.num_train_timesteps)
        tcfg = self.model.transformer.config
        want = (self.model.num_condition_tokens, tcfg.num_attention_heads * tcfg.attention_head_dim)
        if tuple(self.dataset[0]["shot_embeds"].shape) != want:
            raise ValueError(f"conditions in {cfg.conditions} are s_a of "
                             f"{tuple(self.dataset[0]['shot_embeds'].shape)}; the decoder takes {want}")
        self.left_out = left_out
        train = cfg.train
        self.summary = (
            f"{len(self.dataset)} conditions; student {cfg.student_steps} steps at t={plan.times[:-1]} from a "
            f"{cfg.teacher.steps}-step teacher ({sum(s > 1.0 for s in plan.scales)} guided); "
            f"{accelerator.num_processes} process(es); batch {train.batch_size} x {train.grad_accum}"
        )
        # the segments' losses differ by orders of magnitude (the first, from pure noise, is the hardest): each
        # one's mean over the logging interval is logged beside the step's loss
        self.segment_sums = torch.zeros(cfg.student_steps, device=accelerator.device)
        self.segment_counts = torch.zeros(cfg.student_steps, device=accelerator.device)

    def load_weights(self, checkpoint: Path) -> None:
        self.model.load_trained(checkpoint / DECODER_DIR)

    def loss(self, model, core, batch, step, micro):
        # the noise differs per process; the segment is the same on all
        segment = segment_of(self.cfg.seed, step * self.cfg.train.grad_accum + micro, self.cfg.student_steps)
        loss = compute_loss(model, self.teacher, batch, self.plan, segment)
        self.segment_sums[segment] += loss.detach()
        self.segment_counts[segment] += 1
        return {"loss": loss}

    def interval_logs(self) -> dict[str, float]:
        reduce = self.accelerator.reduce
        sums, counts = reduce(self.segment_sums, "sum"), reduce(self.segment_counts, "sum")
        logs = {f"loss_segment_{k}": (sums[k] / counts[k]).item() for k in range(self.cfg.student_steps)
                if counts[k] > 0}
        self.segment_sums.zero_()
        self.segment_counts.zero_()
        return logs

    def save_weights(self, core, state, checkpoint: Path) -> None:
        core.save_trained(checkpoint / DECODER_DIR, state)
        self.plan.sampler.save(checkpoint / DECODER_DIR)

    def checkpoint_logs(self) -> dict:
        return {"sampler_timesteps": list(self.plan.sampler.timesteps)}


def main(argv: list[str] | None = None) -> Path:
    """Train stage (d) from a command line (``--config FILE key=value ... [--resume latest|PATH]``)."""
    return train(StageD, __doc__, argv)
