"""SpriteWorld's stand-in for CogVideoX-2B pretraining: the frozen VAE and base transformer that stage (a) fine-tunes.

    python scripts/pretrain_spriteworld.py --config configs/spriteworld/pretrain.yaml

Stage (a) trains LoRA on top of a *pretrained* text-to-video CogVideoX. No such weights can be downloaded here, and a
random tiny CogVideoX draws noise, so this script plays the part of the pretraining, on SpriteWorld's training films:

1. the frozen text encoder: a tiny random T5 (seeded, never trained, as the issue asks) + sentencepiece tokenizer,
   written to ``output_dir/{text_encoder,tokenizer}`` by :func:`animegamer.tiny.build_tiny_t5`; the tokenizer's
   corpus holds every SpriteWorld word (:func:`animegamer.spriteworld.lexicon`), so each is one token and a
   caption's place always sits at the same token positions (split into letters, "noon" took 4 and moved the place
   of the caption by up to 10 positions, which the MLLM, predicting the shot token by token, could not follow);
2. the VAE — ``output_dir/vae/`` (diffusers ``AutoencoderKLCogVideoX``, one block per ``vae_channels`` entry:
   2^(n-1)x spatial, ``vae_temporal_compression``x temporal (CogVideoX-2B: 4), ``latent_channels`` channels;
   SpriteWorld uses 1x temporal, since a tiny VAE averages a running figure away inside a group of 4 frames (its
   reconstructions of level-5 clips measured level 1-2), and 4x spatial, since
   at 8x a 16 px figure ends up as a smudge, and 4 channels, so that a token's patch_size^2 x channels outputs stay
   well under the tiny transformer's width — at 16 channels its rank-128 output layer cannot predict the noise of
   256 values and leaves it in the samples): trained as an autoencoder on random ``vae_frames``-frame windows of the
   training clips (single frames are the cheapest on a CPU; their causal 3D convolutions are then folded to code a
   clip frame by frame, :func:`frame_by_frame`), L1 + MSE reconstruction of the posterior sample + a
   small KL (``kl_weight``). Figures cover a few % of a frame, so pixels that differ from their place's empty
   scenery (the per-place median of the training frames, :func:`static_backgrounds`) weigh ``1 +
   foreground_weight``. Its ``scaling_factor`` is then set to 1 / std of the posterior means, as CogVideoX-2B's
   1.15. ``resume_vae=true`` keeps the VAE (and the features of step 3) of an earlier run and trains the
   transformer only, provided that run finished both (``report_dir/summary.json`` vouches for the pair only then;
   model folders are written to a temp folder and renamed in, never left half-saved);
3. the stage (a) features (scaled VAE latents, CLIP tokens of the first frames, T5 tokens of the motion text) of
   every clip of ``data.manifest``, written in batches to ``data.features_dir`` with exactly the fields and settings
   of ``animegamer.data.features.precompute_features``, so stage (a) finds them all present;
4. the base transformer — ``output_dir/transformer/`` (diffusers ``CogVideoXTransformer3DModel``, sincos
   positions, ``patch_size``, ``text_tokens`` text tokens: 226 in CogVideoX, 48 in SpriteWorld, whose captions are
   short): all parameters trained as a text-to-video model, the T5 tokens of each clip's caption (its instruction
   line: character, motion, background) entering through the transformer's own text projection exactly as in
   CogVideoX pretraining; v-prediction MSE with CogVideoX-2B's scheduler config (``output_dir/scheduler/``);
   captions are replaced by the empty prompt at ``condition_dropout``. A small model trained from scratch learns to
   guess the scene from the faint signal left in very noisy latents and never reads the caption (its samples from
   pure noise then ignore the text), so the first ``text_warmup_steps`` train at the last timestep only, where the
   latent is pure noise (zero terminal SNR) and only the caption says what to draw, and ``pure_noise_fraction`` of
   every later batch stays there.

``output_dir`` is then a whole diffusers CogVideoX folder (``model_index.json`` included) for ``decoder.pretrained``
and ``t5.path``. ``report_dir`` gets ``metrics.jsonl`` (both losses), ``config.yaml``, ``vae_reconstruction.png``
(ground truth above reconstruction) and ``samples.png`` (text-to-video samples of held-out captions above their
real clips).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from animegamer.cli import parse_config
from animegamer.config import (
    DecoderConfig,
    SamplingConfig,
    SpriteWorldPretrainConfig,
    StageAConfig,
    T5Config,
    TrainConfig,
    to_yaml,
)
from animegamer.data.features import META_FILE, clip_frame_indices, feature_settings, fit_frames
from animegamer.data.manifest import ClipRecord, Manifest, read_manifest
from animegamer.data.tensor_store import TensorStore
from animegamer.data.video import read_video
from animegamer.inference.contact_sheet import contact_sheet
from animegamer.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from animegamer.spriteworld import caption_tags, lexicon
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER, build_tiny_t5, write_model_index
from animegamer.training.checkpoint import write_dir_atomically
from animegamer.training.optim import build_scheduler

PREVIEW_CLIPS = 6
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


class Log:
    """Loss lines in ``report_dir/metrics.jsonl`` (rewritten atomically as they grow)."""

    def __init__(self, path: Path):
        self.path, self.rows = path, []

    def __call__(self, **row) -> None:
        self.rows.append(row)
        atomic_write_jsonl(self.path, self.rows)


def mean_of(rows: list[dict], part: str, first: bool, count: int = 10) -> float:
    losses = [r["loss"] for r in rows if r["part"] == part]
    window = losses[:count] if first else losses[-count:]
    return float(np.mean(window)) if window else float("nan")


# --------------------------------------------------------------------------------------------
# VAE
# --------------------------------------------------------------------------------------------


def static_backgrounds(clips: torch.Tensor, places: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per place (the caption's background), the per-pixel median of all its frames: the scenery without figures.

    Figures stand at different spots in different clips, so the median over a place's clips is its empty scenery.
    Returns the backgrounds (P, H, W, 3) uint8 and each clip's index into them (N,).
    """
    names = sorted(set(places))
    index = torch.tensor([names.index(p) for p in places])
    backgrounds = torch.stack([clips[index == i].flatten(0, 1).median(dim=0).values for i in range(len(names))])
    return backgrounds, index


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


def train_vae(cfg: SpriteWorldPretrainConfig, clips: torch.Tensor, log: Log, scenery: torch.Tensor | None = None):
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


# --------------------------------------------------------------------------------------------
# Stage (a) features, filled in batches
# --------------------------------------------------------------------------------------------


def stage_a_view(cfg: SpriteWorldPretrainConfig) -> StageAConfig:
    """The stage (a) settings the features depend on (same ``feature_settings`` as precompute_features)."""
    return StageAConfig(
        clip=cfg.clip,
        t5=T5Config(path=cfg.output_dir, max_length=cfg.text_tokens),
        decoder=DecoderConfig(pretrained=cfg.output_dir, dtype="fp32"),
        data=cfg.data,
    )


@torch.no_grad()
def fill_features(
    cfg: SpriteWorldPretrainConfig, vae, manifest: Manifest, t5, scenery: dict[str, torch.Tensor]
) -> TensorStore:
    """Latents, CLIP tokens and T5 tokens of every captioned clip into ``data.features_dir`` (a TensorStore).

    With ``scenery`` (place -> empty scenery (H, W, 3)) each clip also gets ``figure_mask`` (F, h, w): the latent
    cells its figures fall in, for the transformer's ``figure_loss_weight`` (a clip of an unknown place gets none).
    Features computed with an earlier VAE are stale: the directory is replaced.
    """
    from animegamer.models.clip_image import CLIPImageFeatures
    from animegamer.models.sampling import vae_encode

    root = Path(cfg.data.features_dir)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    atomic_write_json(root / META_FILE, feature_settings(stage_a_view(cfg)))
    clip = CLIPImageFeatures.from_config(cfg.clip)
    store = TensorStore(root)
    records = [r for r in manifest.records if r.tags]
    picks = clip_frame_indices(cfg.data.num_frames, cfg.data.clip_frames)
    store_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.data.feature_dtype]
    for start in tqdm(range(0, len(records), cfg.feature_batch), desc="features", unit="batch"):
        batch = records[start : start + cfg.feature_batch]
        frames = read_clips(manifest, batch, cfg, progress=False)  # (B, T, H, W, 3)
        latents = vae_encode(vae, frames)  # (B, F, C, h, w)
        clip_tokens = clip(frames[:, picks].flatten(0, 1).permute(0, 3, 1, 2))  # (B * K, Nc, Dc)
        clip_tokens = clip_tokens.unflatten(0, (len(batch), len(picks)))  # (B, K, Nc, Dc)
        text_tokens = t5([caption_tags(r).motion_text() for r in batch])  # (B, Nt, Dt)
        places = [caption_tags(r).environment for r in batch]
        masks = None
        if all(p in scenery for p in places):
            pixels = figure_pixels(frames, torch.stack([scenery[p] for p in places]))  # (B, T, H, W)
            masks = figure_latents(pixels, vae.config.temporal_compression_ratio, 2 ** (len(cfg.vae_channels) - 1))
        shard = {}
        for i, r in enumerate(batch):
            shard[r.clip_id] = {
                "latents": latents[i].permute(1, 0, 2, 3).contiguous(),  # (C, F, h, w)
                "clip_tokens": clip_tokens[i].to(store_dtype).contiguous(),
                "text_tokens": text_tokens[i].to(store_dtype).contiguous(),
            }
            if masks is not None:
                shard[r.clip_id]["figure_mask"] = masks[i].to(torch.uint8).contiguous()  # (F, h, w)
        store.write_shard(shard)
    return TensorStore(root)


# --------------------------------------------------------------------------------------------
# Base transformer
# --------------------------------------------------------------------------------------------


def build_transformer(cfg: SpriteWorldPretrainConfig):
    from diffusers import CogVideoXTransformer3DModel

    spatial = 2 ** (len(cfg.vae_channels) - 1)
    torch.manual_seed(cfg.seed)
    return CogVideoXTransformer3DModel(
        num_attention_heads=cfg.num_heads,
        attention_head_dim=cfg.head_dim,
        in_channels=cfg.latent_channels,
        out_channels=cfg.latent_channels,
        time_embed_dim=cfg.num_heads * cfg.head_dim,
        text_embed_dim=cfg.t5_dim,
        num_layers=cfg.num_layers,
        patch_size=cfg.patch_size,
        sample_height=cfg.data.height // spatial,
        sample_width=cfg.data.width // spatial,
        sample_frames=cfg.data.num_frames,
        temporal_compression_ratio=cfg.vae_temporal_compression,
        max_text_seq_length=cfg.text_tokens,
    )


def moving_cells(figures: torch.Tensor) -> torch.Tensor:
    """Figure cells (N, F, 1, h, w) -> the cells a figure enters or leaves between neighbouring latent frames."""
    change = (figures[:, 1:] - figures[:, :-1]).abs()  # (N, F - 1, 1, h, w)
    before = torch.cat([change[:, :1], change], dim=1)  # frame f vs f - 1 (frame 0: vs frame 1)
    after = torch.cat([change, change[:, -1:]], dim=1)
    return torch.maximum(before, after)


def training_timesteps(cfg: SpriteWorldPretrainConfig, step: int, num_train_timesteps: int, generator) -> torch.Tensor:
    """Timesteps of one batch: uniform, except that a share sits at the last one (pure noise, caption only).

    The share is 1 during the first ``text_warmup_steps`` and ``pure_noise_fraction`` afterwards.
    """
    batch, last = cfg.transformer.batch_size, num_train_timesteps - 1
    timesteps = torch.randint(0, num_train_timesteps, (batch,), generator=generator)
    share = 1.0 if step < cfg.text_warmup_steps else cfg.pure_noise_fraction
    timesteps[torch.rand(batch, generator=generator) < share] = last
    return timesteps


def train_transformer(cfg: SpriteWorldPretrainConfig, store: TensorStore, clip_ids: list[str], empty, log: Log):
    """Text-to-video pretraining of all transformer parameters: v-prediction MSE, captions dropped to ``empty``."""
    from diffusers import CogVideoXDDIMScheduler

    weighted = cfg.figure_loss_weight > 0 or cfg.motion_loss_weight > 0  # both come from the figure masks
    fields = ("latents", "text_tokens", "figure_mask") if weighted else ("latents", "text_tokens")
    rows = [store.load(cid, fields) for cid in clip_ids]
    latents = torch.stack([r["latents"].permute(1, 0, 2, 3) for r in rows]).float()  # (N, F, C, h, w)
    if weighted:  # each latent cell's weight in the v-MSE, fixed per clip: computed once
        figures = torch.stack([r["figure_mask"] for r in rows]).float()[:, :, None]  # (N, F, 1, h, w)
        cell_weight = 1.0 + cfg.figure_loss_weight * figures + cfg.motion_loss_weight * moving_cells(figures)
    text = torch.stack([r["text_tokens"] for r in rows]).float()  # (N, Nt, Dt)
    scheduler = CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER)
    transformer = build_transformer(cfg).train()
    train: TrainConfig = cfg.transformer
    optimizer = torch.optim.AdamW(
        transformer.parameters(), lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay
    )
    lr_scheduler = build_scheduler(optimizer, train)
    generator = torch.Generator().manual_seed(cfg.seed)
    progress = tqdm(range(train.max_steps), desc="pretrain transformer")
    for step in progress:
        picks = torch.randint(0, len(latents), (train.batch_size,), generator=generator)
        x0, condition = latents[picks], text[picks].clone()  # (B, F, C, h, w), (B, Nt, Dt)
        dropped = torch.rand(train.batch_size, generator=generator) < cfg.condition_dropout
        condition[dropped] = empty
        noise = torch.randn(x0.shape, generator=generator)
        timesteps = training_timesteps(cfg, step, scheduler.config.num_train_timesteps, generator)
        noisy = scheduler.add_noise(x0, noise, timesteps)
        prediction = transformer(
            hidden_states=noisy, encoder_hidden_states=condition, timestep=timesteps, return_dict=False
        )[0]
        error = (prediction - scheduler.get_velocity(x0, noise, timesteps)).square()  # (B, F, C, h, w)
        if weighted:
            weight = cell_weight[picks]  # (B, F, 1, h, w)
            loss = (weight * error).mean() / weight.mean()
        else:
            loss = error.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), train.max_grad_norm)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % train.log_every == 0 or step + 1 == train.max_steps:
            log(part="transformer", step=step + 1, loss=loss.item())
            progress.set_postfix(loss=f"{loss.item():.4f}")
    return transformer.eval().requires_grad_(False)


@torch.no_grad()
def sample_preview(cfg: SpriteWorldPretrainConfig, store: TensorStore, manifest: Manifest, records, path: Path):
    """Text-to-video samples of held-out captions (20 DPM steps, no guidance) above the real clips."""
    from animegamer.models.decoder import AnimationShotDecoder

    decoder = AnimationShotDecoder.from_config(
        DecoderConfig(pretrained=cfg.output_dir, lora_rank=0, motion_scope=False, dtype="fp32")
    ).eval()
    weight, bias = decoder.text_projection_state["weight"], decoder.text_projection_state["bias"]
    text = torch.stack([store.load(r.clip_id, ("text_tokens",))["text_tokens"] for r in records]).float()
    sampling = SamplingConfig(
        steps=20, guidance_scale=1.0, height=cfg.data.height, width=cfg.data.width, num_frames=cfg.data.num_frames
    )
    generated = decoder.sample(F.linear(text, weight, bias), None, sampling).numpy()  # (B, T, H, W, 3)
    real = read_clips(manifest, records, cfg, progress=False).numpy()
    rows = []
    for i, r in enumerate(records):
        rows += [(generated[i], ["sample:", *caption_tags(r).motion_text().split("; ")]), (real[i], ["real clip"])]
    return contact_sheet(rows, path, frames_per_row=9)


# --------------------------------------------------------------------------------------------
# Folder
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> Path:
    from diffusers import CogVideoXDDIMScheduler

    from animegamer.models.t5_text import T5TextFeatures

    cfg, _ = parse_config(SpriteWorldPretrainConfig, __doc__, argv)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    out, report = Path(cfg.output_dir), Path(cfg.report_dir)
    report.mkdir(parents=True, exist_ok=True)
    atomic_write_text(report / "config.yaml", to_yaml(cfg))
    log = Log(report / "metrics.jsonl")
    random.seed(cfg.seed)

    manifest = read_manifest(cfg.data.manifest)
    train_films = set(manifest.meta.get("splits", {}).get("train", [])) or {r.film_id for r in manifest.records}
    train_records = [r for r in manifest.records if r.film_id in train_films and r.tags]
    held_out = [r for r in manifest.records if r.film_id not in train_films and r.tags] or train_records
    if not train_records:
        raise SystemExit(f"error: no captioned training clips in {cfg.data.manifest}")

    # 1. frozen tiny T5 (random, seeded) + tokenizer
    out.mkdir(parents=True, exist_ok=True)
    build_tiny_t5(out, seed=cfg.seed, d_model=cfg.t5_dim, words=lexicon())
    t5 = T5TextFeatures.from_config(T5Config(path=str(out), max_length=cfg.text_tokens))

    # 2. VAE, and 3. the stage (a) features of every clip from it (kept from an earlier run if resume_vae)
    earlier = json.loads((report / "summary.json").read_text()) if (report / "summary.json").is_file() else {}
    store = TensorStore(cfg.data.features_dir)
    if cfg.resume_vae and (out / "vae" / "config.json").is_file() and "vae_psnr_db" in earlier and len(store):
        print(f"vae: kept {out / 'vae'} and the features in {cfg.data.features_dir} (resume_vae=true)")
        lines = (report / "metrics.jsonl").read_text().splitlines() if (report / "metrics.jsonl").is_file() else []
        log.rows = [row for row in map(json.loads, lines) if row["part"] == "vae"]
        psnr, scale = earlier["vae_psnr_db"], earlier["vae_scaling_factor"]
    else:
        clips = read_clips(manifest, train_records, cfg)
        places = [caption_tags(r).environment for r in train_records]
        backgrounds, place_of = static_backgrounds(clips, places)
        vae = train_vae(cfg, clips, log, backgrounds[place_of])
        scenery = {places[i]: backgrounds[place_of[i]] for i in range(len(places))}
        scale = set_scaling_factor(vae, clips, cfg.feature_batch)
        # resume_vae keeps a VAE and its features only as a pair that summary.json vouches for: forget the old pair
        # before replacing either, vouch for the new one once both are complete
        kept = {k: v for k, v in earlier.items() if k not in ("vae_psnr_db", "vae_scaling_factor")}
        atomic_write_json(report / "summary.json", kept)
        write_dir_atomically(out / "vae", lambda tmp: vae.save_pretrained(str(tmp)))  # never a partial model
        rng = np.random.default_rng(cfg.seed)
        preview = clips[rng.choice(len(clips), min(PREVIEW_CLIPS, len(clips)), replace=False)]
        vae_sheet, psnr = vae_preview(vae, preview, report / "vae_reconstruction.png")
        print(f"vae: scaling_factor {scale:.4f}, reconstruction PSNR {psnr:.2f} dB: {vae_sheet}")
        del clips
        store = fill_features(cfg, vae, manifest, t5, scenery)
        print(f"features: {len(store)} clips in {cfg.data.features_dir}")
        atomic_write_json(report / "summary.json", {**kept, "vae_psnr_db": psnr, "vae_scaling_factor": scale})

    # 4. base text-to-video transformer
    empty = t5([""])[0]  # (Nt, Dt): the unconditional prompt
    transformer = train_transformer(cfg, store, [r.clip_id for r in train_records], empty, log)
    write_dir_atomically(out / "transformer", lambda tmp: transformer.save_pretrained(str(tmp)))
    scheduler = CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER)
    write_dir_atomically(out / "scheduler", lambda tmp: scheduler.save_pretrained(str(tmp)))
    write_model_index(out)
    picks = np.random.default_rng(cfg.seed).choice(len(held_out), min(PREVIEW_CLIPS, len(held_out)), replace=False)
    sheet = sample_preview(cfg, store, manifest, [held_out[i] for i in sorted(picks)], report / "samples.png")

    summary = {
        "vae_loss_first": mean_of(log.rows, "vae", True),
        "vae_loss_last": mean_of(log.rows, "vae", False),
        "vae_psnr_db": psnr,
        "vae_scaling_factor": scale,
        "transformer_loss_first": mean_of(log.rows, "transformer", True),
        "transformer_loss_last": mean_of(log.rows, "transformer", False),
        "train_clips": len(train_records),
        "seconds": round(time.perf_counter() - started, 1),
    }
    atomic_write_json(report / "summary.json", summary)
    print(json.dumps(summary, indent=2))
    print(f"CogVideoX folder {out}\nsamples          {sheet}")
    return out


if __name__ == "__main__":
    main()
