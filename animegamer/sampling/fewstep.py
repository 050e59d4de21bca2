"""The few-step sampler of a distilled decoder (stage d): K deterministic DDIM steps, no classifier-free guidance.

    noise x_{t_0} (B, F, C, h, w) ─ decoder(x, t_k, s_a, level) = v ─ x0 = sqrt(a_k) x - sqrt(1 - a_k) v
                                  ─ x_{t_{k+1}} = c_k x + d_k x0  (DDIM, eta 0) ─ ... K times ─ x0 latents

The student was trained (animegamer.training.distill) so that this one step from ``t_k`` lands where the teacher's
guided multi-step ODE solution from the same point lands: guidance is folded into its weights, so there is one
transformer call per step and no unconditional branch. Which timesteps it learned is part of the checkpoint:
``sampler.json`` beside the trained decoder parts (:class:`FewStepSampler`), written by scripts/train_stage_d.py
and read by ``sampling.preset: distilled``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import torch

from animegamer.io import atomic_write_json, read_format_json

SAMPLER_FILE = "sampler.json"
SAMPLER_FORMAT = "animegamer-fewstep-v1"


@dataclass(frozen=True)
class FewStepSampler:
    """What a distilled decoder samples with: its timesteps (decreasing), how it was made, from which teacher."""

    timesteps: tuple[int, ...]
    method: str = "segmented trajectory distillation"
    teacher: dict = field(default_factory=dict)  # the teacher's sampling settings (steps, guidance schedule)

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / SAMPLER_FILE
        atomic_write_json(path, {"format": SAMPLER_FORMAT, **asdict(self), "timesteps": list(self.timesteps)})
        return path

    @classmethod
    def load(cls, directory: str | Path, num_train_timesteps: int) -> FewStepSampler:
        """Read and validate ``directory/sampler.json`` (an untrusted file): a ValueError names what is wrong."""
        path = Path(directory) / SAMPLER_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: sampling.preset=distilled needs a stage (d) decoder (scripts/train_stage_d.py)"
            )
        raw = read_format_json(path, SAMPLER_FORMAT, "a few-step sampler record")
        steps = raw.get("timesteps")
        valid = (
            isinstance(steps, list)
            and steps
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < num_train_timesteps for t in steps)
            and all(a > b for a, b in pairwise(steps))
        )
        if not valid:
            raise ValueError(f"{path}: 'timesteps' must be decreasing integers in [0, {num_train_timesteps}), "
                             f"got {steps!r}")
        teacher = raw.get("teacher", {})
        return cls(tuple(steps), str(raw.get("method", "")), teacher if isinstance(teacher, dict) else {})


def alpha_schedule(scheduler_config: dict) -> tuple[torch.Tensor, float]:
    """(alphas_cumprod (T,) float64, the alpha after the last step) of the decoder's DDIM scheduler: CogVideoX's
    SNR-shifted, zero-terminal-SNR schedule exactly as diffusers computes it."""
    from diffusers import CogVideoXDDIMScheduler

    scheduler = CogVideoXDDIMScheduler.from_config(scheduler_config)
    if scheduler.config.prediction_type != "v_prediction":
        raise ValueError(f"few-step sampling assumes v-prediction, got {scheduler.config.prediction_type!r}")
    return scheduler.alphas_cumprod.double(), float(scheduler.final_alpha_cumprod)


def alpha_at(alphas: torch.Tensor, final_alpha: float, t: int) -> float:
    """alpha_cumprod at timestep ``t``; ``t = -1`` is the clean end of the trajectory."""
    return final_alpha if t < 0 else float(alphas[t])


def v_to_x0(x: torch.Tensor, v: torch.Tensor, alpha: float) -> torch.Tensor:
    """The clean-latent prediction of a v-prediction model at a point of noise level ``alpha``."""
    return alpha**0.5 * x - (1 - alpha) ** 0.5 * v


def ddim_coefficients(alpha: float, alpha_next: float) -> tuple[float, float]:
    """(c, d) of the deterministic DDIM step x_next = c x + d x0 from noise level ``alpha`` to ``alpha_next``
    (the same arithmetic as diffusers' CogVideoXDDIMScheduler.step with eta 0)."""
    c = ((1 - alpha_next) / (1 - alpha)) ** 0.5
    return c, alpha_next**0.5 - alpha**0.5 * c


def ddim_step(x: torch.Tensor, x0: torch.Tensor, alpha: float, alpha_next: float) -> torch.Tensor:
    c, d = ddim_coefficients(alpha, alpha_next)
    return c * x + d * x0


@torch.no_grad()
def fewstep_sample(
    decoder, shot_embeds: torch.Tensor, motion_level: torch.Tensor | None, sampler: FewStepSampler,
    latents: torch.Tensor, on_step: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """The distilled sampler, written out: s_a (B, N, H), levels (B,), Gaussian latents (B, F, C, h, w) -> the
    final latents (B, F, C, h, w). One conditional transformer call per timestep of ``sampler``; ``on_step(step,
    steps)`` after each, as :func:`animegamer.sampling.denoise.sample` calls it."""
    alphas, final_alpha = alpha_schedule(decoder.scheduler_config)
    device = decoder.device
    x = latents.to(device).float()
    shots = shot_embeds.to(device)
    levels = motion_level.to(device) if motion_level is not None else None
    times = list(sampler.timesteps) + [-1]
    for step, (t, t_next) in enumerate(pairwise(times)):
        alpha = alpha_at(alphas, final_alpha, t)
        v = decoder(x, torch.full((x.shape[0],), t, device=device, dtype=torch.long), shots, levels)
        x = ddim_step(x, v_to_x0(x, v, alpha), alpha, alpha_at(alphas, final_alpha, t_next))
        if on_step is not None:
            on_step(step + 1, sampler.steps)
    return x
