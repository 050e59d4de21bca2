"""Stage (d)'s pure pieces: the teacher's guided ODE segments, the student's one-step jump, the loss, the data.

The teacher's sampler (M DDIM steps on ``teacher_timesteps``, dynamic CFG of the decoder's schedule) is cut into K
segments at ``boundaries`` (indices into its M steps, 0 = pure noise, M = the clean end). The student learns to
cross each segment in one step:

    x_b (B, F, C, h, w) at teacher step b_k ──teacher: b_{k+1} - b_k guided DDIM steps (2 calls each)──> x_e
                        └──student: one conditional call at t_k, x0_s, DDIM jump to t_{k+1}──────────────> x_s
    loss = || x0_s - x0* ||^2,  x0* = the clean latents that make the DDIM jump from x_b land exactly on x_e

x0* is unique (the jump is c x_b + d x0 with d > 0), so the loss is zero exactly when the student's step matches
the teacher's K-step-coarsened ODE map, and it is measured in clean-latent units at every segment (a raw distance
in x would weight the noisy early segments by their noise scale). x_b comes from the student's own steps from the
noise (no gradient), so it trains on the points its sampler visits (CausVid / Self-Forcing's lesson about
exposure bias). See scripts/train_stage_d.py for why this method.
"""

from __future__ import annotations

import torch

from animegamer.sampling.fewstep import alpha_at, ddim_step, v_to_x0


def segment_boundaries(teacher_steps: int, student_steps: int) -> list[int]:
    """K + 1 indices into the teacher's M steps, evenly spread: [0, ..., M]; segment k is steps b_k .. b_{k+1}-1."""
    if not 1 <= student_steps <= teacher_steps:
        raise ValueError(f"student_steps={student_steps} must be in 1..teacher steps ({teacher_steps})")
    return [round(k * teacher_steps / student_steps) for k in range(student_steps + 1)]


def segment_of(seed: int, micro_batch: int, num_segments: int) -> int:
    """The segment micro-batch ``micro_batch`` (counted over the run, optimizer steps x accumulation) distils: the
    same on every process and a pure function of (seed, micro_batch), like the batch order. Every process then
    calls the student as often as the others, which ZeRO-3 and FSDP2 need (each call gathers the sharded
    parameters together), and a resume draws what the killed run would have drawn."""
    generator = torch.Generator().manual_seed(seed * 100_003 + micro_batch)
    return int(torch.randint(num_segments, (), generator=generator))


def student_timesteps(teacher_timesteps: list[int], boundaries: list[int]) -> list[int]:
    """The student's K timesteps: the teacher's timestep at the start of every segment."""
    return [int(teacher_timesteps[b]) for b in boundaries[:-1]]


def time_after(teacher_timesteps: list[int], index: int) -> int:
    """The timestep reached after teacher step ``index - 1``: the next step's timestep, -1 (clean) at the end."""
    return int(teacher_timesteps[index]) if index < len(teacher_timesteps) else -1


@torch.no_grad()
def teacher_segment(
    teacher, x: torch.Tensor, start: int, end: int, teacher_timesteps: list[int], scales: list[float],
    alphas: torch.Tensor, final_alpha: float, shots: torch.Tensor, levels: torch.Tensor | None,
) -> torch.Tensor:
    """The teacher's guided DDIM solution from ``x`` (B, F, C, h, w) at step ``start`` to step ``end``.

    Every step goes to the next timestep of the grid (clean after the last), which is diffusers' DDIM step when
    the step count divides the 1000 training timesteps (the paper's 50: 20 apart). Each guided step runs the
    unconditional (zero s_a; null level with ``motion_guidance``) and the conditional
    branch in one batch and combines them with that step's scale, as :func:`animegamer.sampling.denoise.sample` does.
    """
    batch = x.shape[0]
    null = teacher.null_shot_embeds(batch, shots.device, shots.dtype)
    null_levels = teacher.unconditional_levels(levels)
    for i in range(start, end):
        t = int(teacher_timesteps[i])
        guided = scales[i] > 1.0
        model_in = torch.cat([x, x]) if guided else x  # (2B | B, F, C, h, w)
        out = teacher(
            model_in,
            torch.full((model_in.shape[0],), t, device=x.device, dtype=torch.long),
            torch.cat([null, shots]) if guided else shots,
            torch.cat([null_levels, levels]) if guided and levels is not None else levels,
        )
        if guided:
            uncond, cond = out.chunk(2)
            out = uncond + scales[i] * (cond - uncond)
        alpha = alpha_at(alphas, final_alpha, t)
        x = ddim_step(x, v_to_x0(x, out, alpha), alpha, alpha_at(alphas, final_alpha, time_after(teacher_timesteps,
                                                                                                 i + 1)))
    return x


def target_x0(x_start: torch.Tensor, x_end: torch.Tensor, alpha: float, alpha_next: float) -> torch.Tensor:
    """The clean latents x0* with ddim_step(x_start, x0*, alpha, alpha_next) == x_end (requires alpha_next > alpha)."""
    if not alpha_next > alpha:
        raise ValueError(f"a segment must go towards less noise (alpha {alpha} -> {alpha_next})")
    c = ((1 - alpha_next) / (1 - alpha)) ** 0.5
    d = alpha_next**0.5 - alpha**0.5 * c
    return (x_end - c * x_start) / d


def student_x0(model, x: torch.Tensor, t: int, shots: torch.Tensor, levels: torch.Tensor | None,
               alpha: float) -> torch.Tensor:
    """The student's clean-latent prediction at ``x`` (B, F, C, h, w), timestep ``t``, conditional only."""
    v = model(x, torch.full((x.shape[0],), t, device=x.device, dtype=torch.long), shots, levels)
    return v_to_x0(x, v, alpha)


@torch.no_grad()
def student_rollout(model, x: torch.Tensor, times: list[int], upto: int, shots, levels, alphas, final_alpha):
    """The student's own sampler from pure noise ``x`` through its first ``upto`` steps (no gradient)."""
    for k in range(upto):
        alpha, alpha_next = alpha_at(alphas, final_alpha, times[k]), alpha_at(alphas, final_alpha, times[k + 1])
        x = ddim_step(x, student_x0(model, x, times[k], shots, levels, alpha), alpha, alpha_next)
    return x


