"""SpriteWorld's stand-in VAE: a tiny ``AutoencoderKLCogVideoX`` trained as an autoencoder on the training clips.

One block per ``vae_channels`` entry: 2^(n-1)x spatial, ``vae_temporal_compression``x temporal (CogVideoX-2B: 4),
``latent_channels`` channels. SpriteWorld uses 1x temporal, since a tiny VAE averages a running figure away inside a
group of 4 frames (its reconstructions of level-5 clips measured level 1-2), and 4x spatial, since at 8x a 16 px
figure ends up as a smudge, and 4 channels, so that a token's patch_size^2 x channels outputs stay well under the
tiny transformer's width (at 16 channels its rank-128 output layer cannot predict the noise of 256 values and leaves
it in the samples).

Trained on random ``vae_frames``-frame windows of the training clips (single frames are the cheapest on a CPU;
their causal 3D convolutions are then folded to code a clip frame by frame, :func:`frame_by_frame`): L1 + MSE
reconstruction of the posterior sample + a small KL (``kl_weight``). Figures cover a few % of a frame, so pixels
that differ from their clip's empty scenery (drawn by the world, :func:`empty_scenery`) weigh
``1 + foreground_weight``. Its ``scaling_factor`` is then set to 1 / std of the
posterior means (:func:`set_scaling_factor`), as CogVideoX-2B's 1.15.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from animegamer.config import SpriteWorldPretrainConfig
from animegamer.data.features import fit_frames
from animegamer.data.manifest import ClipRecord, Manifest
from animegamer.data.video import read_video
from animegamer.game.contact_sheet import contact_sheet
from animegamer.spriteworld.home import HomeLook, home_background
from animegamer.training.optim import build_scheduler

FOREGROUND_THRESHOLD = 24  # a pixel further than this (0..255, any channel) from its place's scenery is a figure


def read_clips(
    manifest: Manifest, records: list[ClipRecord], cfg: SpriteWorldPretrainConfig, progress: bool = True
) -> torch.Tensor:
    """uint8 frames (N, T, H, W, 3) of ``records`` at the configured clip size."""
    frames = []
    for record in tqdm(records, desc="read clips", unit="clip", disable=not progress):
        video, _ = read_video(manifest.video_path(record), fps=cfg.data.fps)
        frames.append(fit_frames(video, cfg.data.num_frames, cfg.data.height, cfg.data.width))
    return torch.stack(frames)


def to_unit(frames: torch.Tensor) -> torch.Tensor:
    """uint8 (B, T, H, W, 3) -> float (B, 3, T, H, W) in [-1, 1], the VAE's input."""
    return frames.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """float (B, 3, T, H, W) in [-1, 1] -> uint8 (B, T, H, W, 3)."""
    return ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1).numpy()



def empty_scenery(records: list[ClipRecord], height: int, width: int) -> torch.Tensor:
    """Each clip's empty scenery (N, H, W, 3) uint8, drawn by the world: its place at its time of day and, indoors
    in a memory film, the film's own home (the record's ``extra``).

    Drawn, not estimated: a median over the clips of a place (the earlier way) is the empty place only when every
    clip of it looks alike, and a memory film's bedroom and kitchen have their own colours, so against the median
    the whole room counted as figure and indoor frames took ~11x the weight of every outdoor pixel (the VAE then
    drew the park grey). Against the drawn scenery ~7-14% of a decoded frame differs (figures and codec edges).
    """

    return torch.stack([
        torch.from_numpy(np.array(home_background(r.extra["place"], r.extra["time"], height, width,
                                                  HomeLook.from_value(r.extra.get("home")))))
        for r in records
    ])


def figure_pixels(frames: torch.Tensor, scenery: torch.Tensor) -> torch.Tensor:
    """uint8 frames (B, T, H, W, 3) and their places' empty scenery (B, H, W, 3) -> where figures are (B, T, H, W)."""
    return (frames.float() - scenery[:, None].float()).abs().amax(dim=-1) > FOREGROUND_THRESHOLD


def figure_latents(pixels: torch.Tensor, temporal: int, spatial: int) -> torch.Tensor:
    """Figure pixels (B, T, H, W) -> the latent cells they fall in (B, F, H / spatial, W / spatial), 0. or 1.

    The causal VAE encodes frame 0 alone and each later group of ``temporal`` frames into one latent frame.
    """
    first, rest = pixels[:, :1], pixels[:, 1:]
    groups = rest.unflatten(1, (rest.shape[1] // temporal, temporal)).any(dim=2)  # (B, F - 1, H, W)
    cells = torch.cat([first, groups], dim=1).float()  # (B, F, H, W)
    return F.max_pool2d(cells, spatial)  # (B, F, h, w)


def train_vae(cfg: SpriteWorldPretrainConfig, clips: torch.Tensor, log: Callable[..., None],
              scenery: torch.Tensor | None = None):
    """Train a tiny AutoencoderKLCogVideoX on random ``vae_frames`` windows of ``clips``; returns it in eval mode.

    With ``foreground_weight`` > 0 and ``scenery`` (each clip's empty place, (N, H, W, 3)), pixels that differ from
    it (the figures, a few % of a frame) weigh ``1 + foreground_weight`` in the reconstruction loss: an unweighted
    loss is spent on the background and leaves the characters as smudges. With ``vae_latent_noise`` > 0 the latents
    are decoded with Gaussian noise of that share of their std added: a decoder trained on exact latents turns the
    small errors of a diffusion model's latents into colour clutter over the whole picture.
    """
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(cfg.seed)
    vae = AutoencoderKLCogVideoX(
        block_out_channels=tuple(cfg.vae_channels),
        latent_channels=cfg.latent_channels,
        layers_per_block=1,
        norm_num_groups=4,
        down_block_types=("CogVideoXDownBlock3D",) * len(cfg.vae_channels),  # one block per width: 2^(n-1)x spatial
        up_block_types=("CogVideoXUpBlock3D",) * len(cfg.vae_channels),
        temporal_compression_ratio=cfg.vae_temporal_compression,
        sample_height=cfg.data.height,
        sample_width=cfg.data.width,
    ).train()
    train = cfg.vae
    optimizer = torch.optim.AdamW(vae.parameters(), lr=train.lr, betas=tuple(train.betas), weight_decay=0.0)
    lr_scheduler = build_scheduler(optimizer, train)
    rng = np.random.default_rng(cfg.seed)
    window = cfg.vae_frames
    weigh = cfg.foreground_weight > 0 and scenery is not None
    progress = tqdm(range(train.max_steps), desc="pretrain vae")
    for step in progress:
        picks = rng.integers(0, len(clips), train.batch_size)
        starts = rng.integers(0, clips.shape[1] - window + 1, train.batch_size)
        frames = torch.stack([clips[i, s : s + window] for i, s in zip(picks, starts, strict=True)])  # (B,T,H,W,3)
        x = to_unit(frames)
        posterior = vae.encode(x).latent_dist
        z = posterior.sample()
        if cfg.vae_latent_noise > 0:  # the decoder learns to draw clean pictures from slightly wrong latents
            z = z + cfg.vae_latent_noise * z.detach().std() * torch.randn_like(z)
        reconstruction = vae.decode(z).sample  # (B, 3, T, H, W)
        weight = torch.ones_like(x[:, :1])  # (B, 1, T, H, W)
        if weigh:
            moved = figure_pixels(frames, scenery[picks])  # (B, T, H, W)
            weight = weight + cfg.foreground_weight * moved[:, None].float()
        weight = weight / weight.mean()
        rec_l1 = (weight * (reconstruction - x).abs()).mean()
        rec_mse = (weight * (reconstruction - x).square()).mean()
        kl = posterior.kl().mean() / x[0].numel()  # per pixel value, so kl_weight does not depend on clip size
        loss = rec_l1 + rec_mse + cfg.kl_weight * kl
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), train.max_grad_norm)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % train.log_every == 0 or step + 1 == train.max_steps:
            log(part="vae", step=step + 1, loss=loss.item(), l1=rec_l1.item(), mse=rec_mse.item(), kl=kl.item())
            progress.set_postfix(l1=f"{rec_l1.item():.4f}")
    if window == 1:
        frame_by_frame(vae)
    return vae.eval().requires_grad_(False)


@torch.no_grad()
def frame_by_frame(vae) -> None:
    """Fold every causal 3D convolution's time taps into the tap of the current frame.

    A VAE trained on single pictures only ever saw its causal padding (copies of the one frame) in the earlier
    taps, so only their sum was trained; on a video those taps would blend earlier frames into each frame and
    ghost moving figures. Folded, every single picture encodes and decodes exactly as before, and a video is
    coded frame by frame (up to the group norms' statistics over the clip).
    """
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d

    for module in vae.modules():
        if isinstance(module, CogVideoXCausalConv3d) and module.time_kernel_size > 1:
            weight = module.conv.weight  # (out, in, t, kh, kw)
            weight[:, :, -1] = weight.sum(dim=2)
            weight[:, :, :-1] = 0.0


@torch.no_grad()
def set_scaling_factor(vae, clips: torch.Tensor, batch: int) -> float:
    """1 / std of the posterior means over ``clips``: latents of unit variance for the diffusion model."""
    means = [vae.encode(to_unit(clips[i : i + batch])).latent_dist.mode() for i in range(0, len(clips), batch)]
    std = torch.cat(means).std().item()
    vae.register_to_config(scaling_factor=1.0 / std)
    return 1.0 / std


@torch.no_grad()
def vae_preview(vae, clips: torch.Tensor, path: Path) -> tuple[Path, float]:
    """Ground truth above reconstruction for a few clips; returns the sheet and the reconstruction PSNR (dB)."""
    x = to_unit(clips)
    video = vae.decode(vae.encode(x).latent_dist.mode()).sample
    mse = F.mse_loss(((video.clamp(-1, 1) + 1) / 2), (x + 1) / 2).item()
    real, rec = clips.numpy(), to_uint8(video)
    rows = []
    for i in range(len(clips)):
        rows += [(real[i], ["ground truth"]), (rec[i], ["VAE reconstruction"])]
    return contact_sheet(rows, path, frames_per_row=9), -10 * math.log10(max(mse, 1e-10))
