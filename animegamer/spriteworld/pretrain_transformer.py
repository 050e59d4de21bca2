"""SpriteWorld's stand-in base transformer: a tiny ``CogVideoXTransformer3DModel`` pretrained as a text-to-video
model, and the stage (a) features it and stage (a) read.

- The stage (a) features (scaled VAE latents, CLIP tokens of the first frames, T5 tokens of the motion text) of every
  clip of ``data.manifest`` are written in batches to ``data.features_dir`` with exactly the fields and settings of
  ``animegamer.data.features.precompute_features``, so stage (a) finds them all present (:func:`fill_features`).
- The transformer (sincos positions, ``patch_size``, ``text_tokens`` text tokens: 226 in CogVideoX, 48 in SpriteWorld,
  whose captions are short) trains all its parameters as a text-to-video model, the T5 tokens of each clip's caption
  (``memory.caption_text``: character, motion, background; a memory film's home and companion) entering through the
  transformer's own text projection exactly as in CogVideoX pretraining; v-prediction MSE with CogVideoX-2B's
  scheduler config; captions are replaced by the empty prompt at ``condition_dropout``. A small model trained from
  scratch learns to guess the scene from the faint signal left in very noisy latents and never reads the caption (its
  samples from pure noise then ignore the text), so the first ``text_warmup_steps`` train at the last timestep only,
  where the latent is pure noise (zero terminal SNR) and only the caption says what to draw, and
  ``pure_noise_fraction`` of every later batch stays there (:func:`training_timesteps`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from animegamer.cli import UsageError
from animegamer.config import (
    DecoderConfig,
    SamplingConfig,
    SpriteWorldPretrainConfig,
    StageAConfig,
    T5Config,
    TrainConfig,
)
from animegamer.data.features import META_FILE, clip_frame_indices, feature_settings
from animegamer.data.manifest import Manifest
from animegamer.data.name_swaps import SWAP_NAMES_FIELD, SWAP_TEXT_FIELD, names_tensor, rename, swap_pairs
from animegamer.data.tensor_store import TensorStore
from animegamer.game.contact_sheet import contact_sheet
from animegamer.io import atomic_write_json
from animegamer.models.clip_image import CLIPImageFeatures
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.vae import vae_encode
from animegamer.models.weights import load_state_dict_file
from animegamer.sampling.denoise import sample
from animegamer.spriteworld.memory import caption_text
from animegamer.spriteworld.pretrain_vae import empty_scenery, figure_latents, figure_pixels, read_clips
from animegamer.spriteworld.world import CHARACTERS
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER
from animegamer.training.optim import build_scheduler


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
    cfg: SpriteWorldPretrainConfig, vae, manifest: Manifest, t5, figure_masks: bool = True
) -> TensorStore:
    """Latents, CLIP tokens and T5 tokens of every captioned clip into ``data.features_dir`` (a TensorStore), and
    with ``data.identity_swaps`` > 0, for a clip with a friend, the T5 tokens of its identity swaps
    (``swap_text_tokens`` (S, Nt, Dt): the caption with each other character named instead,
    :func:`animegamer.data.name_swaps.name_swaps`).

    With ``figure_masks`` each clip also gets ``figure_mask`` (F, h, w): the latent cells its figures fall in (the
    pixels that differ from its drawn empty scenery), for the transformer's ``figure_loss_weight``.
    Features computed with an earlier VAE are stale: the directory is replaced.
    """

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
        captions = [caption_text(r) for r in batch]
        text_tokens = t5(captions)  # (B, Nt, Dt)
        limit = cfg.data.identity_swaps
        pairs = [swap_pairs(text, r.extra.get("character", ""), list(CHARACTERS), limit) if limit else []
                 for text, r in zip(captions, batch, strict=True)]
        swaps = [[rename(text, old, new) for old, new in found] for text, found in zip(captions, pairs, strict=True)]
        flat = [text for texts in swaps for text in texts]
        swap_tokens = t5(flat).split([len(texts) for texts in swaps]) if flat else [()] * len(batch)
        masks = None
        if figure_masks:
            pixels = figure_pixels(frames, empty_scenery(batch, cfg.data.height, cfg.data.width))  # (B, T, H, W)
            masks = figure_latents(pixels, vae.config.temporal_compression_ratio, 2 ** (len(cfg.vae_channels) - 1))
        shard = {}
        for i, r in enumerate(batch):
            shard[r.clip_id] = {
                "latents": latents[i].permute(1, 0, 2, 3).contiguous(),  # (C, F, h, w)
                "clip_tokens": clip_tokens[i].to(store_dtype).contiguous(),
                "text_tokens": text_tokens[i].to(store_dtype).contiguous(),
            }
            if len(swap_tokens[i]):  # identity swaps: the caption with another friend named (S, Nt, Dt)
                shard[r.clip_id][SWAP_TEXT_FIELD] = swap_tokens[i].to(store_dtype).contiguous()
                shard[r.clip_id][SWAP_NAMES_FIELD] = names_tensor(pairs[i])  # (S, 2, NAME_CODES): who for whom
            if masks is not None:
                shard[r.clip_id]["figure_mask"] = masks[i].to(torch.uint8).contiguous()  # (F, h, w)
        store.write_shard(shard)
    return TensorStore(root)



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


WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"


class InitTransformerError(UsageError, ValueError):
    """``init_transformer`` names no readable weights of the architecture the config builds (one line)."""


def init_weights(cfg: SpriteWorldPretrainConfig) -> dict[str, torch.Tensor] | None:
    """The weights of ``cfg.init_transformer`` (None without one), checked against the transformer ``cfg`` builds:
    the same tensor names and shapes, else :class:`InitTransformerError` naming the first difference. Read by
    :func:`animegamer.models.weights.load_state_dict_file` (safetensors, checked whole), before anything trains."""
    if not cfg.init_transformer:
        return None
    path = Path(cfg.init_transformer) / WEIGHTS_FILE
    where = f"init_transformer={cfg.init_transformer}"
    try:
        weights = load_state_dict_file(path)
    except FileNotFoundError:
        raise InitTransformerError(f"{where}: {path}: no such file") from None
    except ValueError as exc:  # not a regular file, too big, damaged (DamagedFileError)
        raise InitTransformerError(f"{where}: {exc}") from None
    expected = {name: tuple(t.shape) for name, t in build_transformer(cfg).state_dict().items()}
    for name in sorted(set(expected) | set(weights)):
        if name not in weights:
            raise InitTransformerError(f"{where}: not this architecture: no tensor {name}")
        if name not in expected:
            raise InitTransformerError(f"{where}: not this architecture: an unknown tensor {name}")
        if tuple(weights[name].shape) != expected[name]:
            raise InitTransformerError(
                f"{where}: not this architecture: {name} is {tuple(weights[name].shape)}, {expected[name]} here")
        if not weights[name].is_floating_point():
            raise InitTransformerError(f"{where}: {name} is {weights[name].dtype}, not floating point")
    return weights


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


def train_transformer(cfg: SpriteWorldPretrainConfig, store: TensorStore, clip_ids: list[str], empty,
                      log: Callable[..., None], init: dict[str, torch.Tensor] | None = None):
    """Text-to-video pretraining of all transformer parameters: v-prediction MSE, captions dropped to ``empty``.
    ``init`` (:func:`init_weights`) replaces the seeded random init: ``max_steps`` more steps for a trained one.
    ``transformer_cycles`` runs the whole schedule that many times, each cycle from the last one's weights with a
    fresh optimizer, learning-rate schedule and batch generator (the seed's): what chaining runs by ``init`` gives."""
    weighted = cfg.figure_loss_weight > 0 or cfg.motion_loss_weight > 0  # both come from the figure masks
    fields = ("latents", "text_tokens", "figure_mask") if weighted else ("latents", "text_tokens")
    rows = [store.load(cid, fields) for cid in clip_ids]
    latents = torch.stack([r["latents"].permute(1, 0, 2, 3) for r in rows]).float()  # (N, F, C, h, w)
    cell_weight = None
    if weighted:  # each latent cell's weight in the v-MSE, fixed per clip: computed once
        figures = torch.stack([r["figure_mask"] for r in rows]).float()[:, :, None]  # (N, F, 1, h, w)
        cell_weight = 1.0 + cfg.figure_loss_weight * figures + cfg.motion_loss_weight * moving_cells(figures)
    text = torch.stack([r["text_tokens"] for r in rows]).float()  # (N, Nt, Dt)
    transformer = build_transformer(cfg).train()
    if init is not None:
        transformer.load_state_dict({name: t.float() for name, t in init.items()}, strict=True)
    for cycle in range(cfg.transformer_cycles):
        train_cycle(cfg, transformer, latents, text, cell_weight, empty, log, cycle)
    return transformer.eval().requires_grad_(False)


def train_cycle(cfg: SpriteWorldPretrainConfig, transformer, latents: torch.Tensor, text: torch.Tensor,
                cell_weight: torch.Tensor | None, empty: torch.Tensor, log: Callable[..., None], cycle: int) -> None:
    """One run of the transformer's schedule (``transformer.max_steps`` steps) on ``latents`` (N, F, C, h, w) and
    their captions' ``text`` (N, Nt, Dt); ``cell_weight`` (N, F, 1, h, w) weighs the v-MSE's cells (None: plain).
    Logged steps count on from the earlier cycles'."""
    from diffusers import CogVideoXDDIMScheduler

    scheduler = CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER)
    train: TrainConfig = cfg.transformer
    optimizer = torch.optim.AdamW(
        transformer.parameters(), lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay
    )
    lr_scheduler = build_scheduler(optimizer, train)
    generator = torch.Generator().manual_seed(cfg.seed)
    cycles = cfg.transformer_cycles
    progress = tqdm(range(train.max_steps),
                    desc="pretrain transformer" + (f" (cycle {cycle + 1}/{cycles})" if cycles > 1 else ""))
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
        if cell_weight is not None:
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
            log(part="transformer", step=cycle * train.max_steps + step + 1, loss=loss.item())
            progress.set_postfix(loss=f"{loss.item():.4f}")


@torch.no_grad()
def sample_preview(cfg: SpriteWorldPretrainConfig, store: TensorStore, manifest: Manifest, records, path: Path):
    """Text-to-video samples of held-out captions (20 DPM steps, no guidance) above the real clips."""

    decoder = AnimationShotDecoder.from_config(
        DecoderConfig(pretrained=cfg.output_dir, lora_rank=0, motion_scope=False, dtype="fp32")
    ).eval()
    weight, bias = decoder.text_projection_state["weight"], decoder.text_projection_state["bias"]
    text = torch.stack([store.load(r.clip_id, ("text_tokens",))["text_tokens"] for r in records]).float()
    sampling = SamplingConfig(
        steps=20, guidance_scale=1.0, height=cfg.data.height, width=cfg.data.width, num_frames=cfg.data.num_frames
    )
    generated = sample(decoder, F.linear(text, weight, bias), None, sampling).numpy()  # (B, T, H, W, 3)
    real = read_clips(manifest, records, cfg, progress=False).numpy()
    rows = []
    for i, r in enumerate(records):
        lines = caption_text(r).replace(". ", "; ").split("; ")
        rows += [(generated[i], ["sample:", *lines]), (real[i], ["real clip"])]
    return contact_sheet(rows, path, frames_per_row=9)
