"""The release's decoder sampler (SAT's VPSDEDPMPP2MSampler + DynamicCFG), written from the facts of
the official reference set's README (B7, B9, B10, B15), for ``compat: released``.

One step i of N, with a_i the ascending √ᾱ schedule (a_N = 1) and t_i = timesteps[N-1-i]:

    dit = DiT([x, x], t_i, [null, s_a], flow)                     both CFG rows, the raw integer timestep
    q   = the denoiser's own √ᾱ table entry nearest a_i           (B9: "snapping"; the update uses a_i)
    x0  = q x - √(1 - q²) dit                                      v-prediction, per row
    D   = u + w (c - u),  w = 1 + g (1 - cos(π ((N - t_i) / N)^e)) / 2     (B7: the raw timestep, not i)
    last step: return D; otherwise the stochastic DPM-Solver++(2M) update with λ = log(a / √(1 - a²)):
    x   = m1 x - m2 D' + σ ε,   D' = D on the first step, (1 + 1/2r) D - (1/2r) D_prev after it,
    and after the first step one noise draw is made and thrown away before ε (B10).

:class:`Quirks` switches each release behaviour off one by one, which is how
research/official/measure_decoder.py measures them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class Quirks:
    """The release's behaviours that ``compat: fixed`` would not have (all on: the release's numerics)."""

    snap_alpha: bool = True  # B9: the denoiser uses the nearest entry of its 1000-step table, not the sampler's √ᾱ
    cfg_on_timestep: bool = True  # B7: the dynamic CFG ramp reads the raw timestep instead of the step index
    discarded_draw: bool = True  # B10: one unused noise draw per middle step (needed to reproduce a seed)
    bf16_shots: bool = True  # B15: s_a rounded to bfloat16 before it enters the DiT


RELEASED = Quirks()
NO_QUIRKS = Quirks(snap_alpha=False, cfg_on_timestep=False, discarded_draw=False, bf16_shots=False)


def alphas_cumprod(settings: dict) -> np.ndarray:
    """ᾱ of every training timestep (float64): linear-in-√β schedule, then the SNR shift ᾱ / (s + (1 - s) ᾱ)."""
    n = int(settings["num_idx"])
    betas = np.linspace(settings["linear_start"] ** 0.5, settings["linear_end"] ** 0.5, n, dtype=np.float64) ** 2
    cumprod = np.cumprod(1.0 - betas)
    shift = float(settings["shift_scale"])
    return cumprod / (shift + (1.0 - shift) * cumprod)


def _zero_snr_sqrt(selected: np.ndarray) -> torch.Tensor:
    """√ᾱ of selected timesteps (ascending t), rescaled so the last is 0 and the first keeps its value (float32),
    returned ascending in √ᾱ (descending t)."""
    sqrt = torch.tensor(selected, dtype=torch.float32).sqrt()
    first, last = sqrt[0].clone(), sqrt[-1].clone()
    sqrt = (sqrt - last) * (first / (first - last))
    return sqrt.flip(0)


def sampler_schedule(steps: int, settings: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(√ᾱ ascending (steps,) float32, timesteps ascending (steps,) int64); step i uses √ᾱ[i], timesteps[-1-i].

    The rescale is anchored on the selected subset (its smallest timestep keeps its √ᾱ), not on all 1000 steps.
    """
    n = int(settings["num_idx"])
    timesteps = np.linspace(n - 1, 0, steps, endpoint=False).astype(int)[::-1].copy()
    return _zero_snr_sqrt(alphas_cumprod(settings)[timesteps]), torch.from_numpy(timesteps).long()


def denoiser_table(settings: dict) -> torch.Tensor:
    """The denoiser's own ascending √ᾱ table over all ``num_idx`` timesteps (anchored at t = 0), float32."""
    return _zero_snr_sqrt(alphas_cumprod(settings))


def snap_to_table(alpha: float | torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The entry of ``table`` nearest ``alpha`` (the first one on a tie), float32 scalar tensor."""
    alpha = torch.as_tensor(alpha, dtype=torch.float32)
    return table[(alpha - table).abs().argmin()]


def dynamic_cfg_scale(position: float, steps: int, scale: float, exponent: float) -> float:
    """DynamicCFG's w at ``position``: the release passes the raw timestep, the fixed ramp the step index.

    Evaluated in float64 Python math in the release's operation order: with the timestep, ((N - t) / N)^e is a
    huge negative number and w oscillates; the value has to be reproduced exactly, not approximately.
    """
    return 1 + scale * (1 - math.cos(math.pi * ((steps - position) / steps) ** exponent)) / 2


def _draws(shape, device, generator: torch.Generator | None, noises: Iterator[torch.Tensor] | None):
    """The noise source: recorded draws in order (the parity test), or the generator."""
    if noises is not None:
        return lambda: next(noises).to(device=device, dtype=torch.float32)
    step_generator = generator
    if generator is not None and generator.device != torch.device(device) and torch.device(device).type != "cpu":
        # the release draws x_T on the CPU and the step noises with randn_like on the model's device, both from
        # one torch.manual_seed: a generator of that device with the same seed does the same
        step_generator = torch.Generator(device).manual_seed(generator.initial_seed())
    return lambda: torch.randn(shape, generator=step_generator, device=device, dtype=torch.float32)


def denoise(decoder, x, timestep: int, alpha, shots2, values2, table, quirks: Quirks) -> torch.Tensor:
    """Both CFG rows' x0 (2B, F, C, h, w) float32: the DiT on [x, x] at the raw timestep, v -> x0 with √ᾱ."""
    q = snap_to_table(alpha, table) if quirks.snap_alpha else torch.as_tensor(alpha, dtype=torch.float32)
    model_in = torch.cat([x, x])  # (2B, F, C, h, w): rows [uncond, cond]
    t = torch.full((model_in.shape[0],), float(timestep), device=x.device)
    out = decoder(model_in, t, shots2, motion_value=values2)
    q = q.to(x.device)
    return out * -(1 - q**2) ** 0.5 + model_in * q


@torch.no_grad()
def sample_released(
    decoder,
    shot_embeds: torch.Tensor,
    motion_values: torch.Tensor,
    latent_shape: tuple[int, int, int, int],
    settings: dict,
    steps: int,
    guidance_scale: float,
    guidance_exponent: float,
    generator: torch.Generator | None = None,
    noises: Iterator[torch.Tensor] | None = None,
    init_noise: torch.Tensor | None = None,
    quirks: Quirks = RELEASED,
    trace: dict | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """The release's sampler: s_a (B, N, H) and flow values (B,) -> latents x0 (B, F, C, h, w) float32.

    ``init_noise`` + ``noises`` inject recorded draws (x_T, then every later draw in order); otherwise they come
    from ``generator``. ``trace``, when given, receives ``x_in`` and ``denoised`` lists (one entry per step).
    ``on_step(step, steps)`` is called after every step, as by ``animegamer.sampling.denoise.sample``.
    """
    device = decoder.device
    batch = shot_embeds.shape[0]
    shape = (batch, *latent_shape)
    alphas, timesteps = sampler_schedule(steps, settings)
    alphas = torch.cat([alphas, alphas.new_ones(1)]).to(device)  # a_N = 1 closes the schedule
    table = denoiser_table(settings).to(device)
    if init_noise is None:
        init_noise = torch.randn(shape, generator=generator, dtype=torch.float32)  # the release: on the CPU
    x = init_noise.to(device=device, dtype=torch.float32)
    draw = _draws(shape, device, generator, noises)

    shots = shot_embeds.to(device)
    if quirks.bf16_shots:
        shots = shots.to(torch.bfloat16)
    shots2 = torch.cat([decoder.null_shot_embeds(batch, device, decoder.dtype), shots.to(decoder.dtype)])
    values2 = torch.cat([motion_values, motion_values]).to(device=device, dtype=torch.float32)
    lam = lambda a: torch.log(a / (1 - a**2) ** 0.5)  # noqa: E731  (-inf at a = 0: the first step's m1 is 0)
    previous = None
    for i in range(steps):
        a, a_next = alphas[i], alphas[i + 1]
        t = int(timesteps[steps - 1 - i])
        rows = denoise(decoder, x, t, a, shots2, values2, table, quirks)
        uncond, cond = rows.chunk(2)
        w = dynamic_cfg_scale(t if quirks.cfg_on_timestep else i, steps, guidance_scale, guidance_exponent)
        denoised = uncond + w * (cond - uncond)
        if trace is not None:
            trace.setdefault("x_in", []).append(x)
            trace.setdefault("denoised", []).append(denoised)
        if on_step is not None:
            on_step(i + 1, steps)
        if i == steps - 1:
            return denoised
        h = lam(a_next) - lam(a)
        m1 = ((1 - a_next**2) / (1 - a**2)) ** 0.5 * torch.exp(-h)
        m2 = torch.expm1(-2 * h) * a_next
        sigma = (1 - a_next**2) ** 0.5 * (1 - torch.exp(-2 * h)) ** 0.5
        if previous is None:
            update = denoised
        else:
            r = (lam(a) - lam(alphas[i - 1])) / h  # inf after the a = 0 step: D' = D
            update = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * previous
            if quirks.discarded_draw:
                draw()
        x = m1 * x - m2 * update + sigma * draw()
        previous = denoised
    raise ValueError("steps must be >= 1")
