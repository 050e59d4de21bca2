"""SpriteWorld's stand-in for CLIP's pretraining: the tiny open_clip model trained with CLIP's own contrastive
objective on the training films' (frame, caption) pairs, before stage (a)'s features are filled with it.

The paper's image encoder is a pretrained CLIP ViT-H: its patch tokens already say who is in a frame. A tiny
*random* CLIP keeps little of that: a linear probe reads the friend from its tokens of a real frame barely above the
majority class (``docs/spriteworld.md``, "Where the friend is lost"), so the shot carried the friend only through
the caption's words, and a turn that does not name the friend had nothing to copy it from. Pretrained here, on the
frames the films show and the captions that describe them (character, action, place, time, home, companion), the
stand-in plays the part the real CLIP plays.

    weights, report = train_clip(cfg, manifest, train_records, log)   # cfg.clip_training.max_steps > 0

The frames are the ``data.clip_frames`` frames stage (a) reads of each clip (one drawn at random per pair and
step), preprocessed exactly as :class:`~animegamer.models.clip_image.CLIPImageFeatures` does; the captions are
:func:`~animegamer.spriteworld.memory.caption_text`. The run draws from its own seeded generators, so the VAE and
transformer trained after it are the same with or without it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

from animegamer.config import SpriteWorldPretrainConfig
from animegamer.data.features import clip_frame_indices
from animegamer.data.manifest import ClipRecord, Manifest
from animegamer.io import atomic_path
from animegamer.models.clip_image import CLIPImageFeatures, load_open_clip
from animegamer.spriteworld.memory import caption_text
from animegamer.spriteworld.pretrain_vae import read_clips
from animegamer.training.optim import build_scheduler

RETRIEVAL_BATCH = 32  # held-out image -> caption retrieval is scored among this many pairs at a time (at most)


def clip_frames(manifest: Manifest, records: list[ClipRecord], cfg: SpriteWorldPretrainConfig) -> torch.Tensor:
    """uint8 (N, K, 3, H, W): the ``data.clip_frames`` frames stage (a) reads of each clip."""
    picks = clip_frame_indices(cfg.data.num_frames, cfg.data.clip_frames)
    return read_clips(manifest, records, cfg)[:, picks].permute(0, 1, 4, 2, 3).contiguous()


def _tokens(tokenizer, records: list[ClipRecord]) -> torch.Tensor:
    return tokenizer([caption_text(r) for r in records])


@torch.no_grad()
def retrieval_accuracy(model, images: torch.Tensor, texts: torch.Tensor, prep: Callable, batch: int) -> float:
    """Share of frames whose own caption is the nearest of the ``batch`` captions scored with it (chance
    ``1 / batch``); ``images`` (N, 3, H, W) uint8, ``texts`` (N, L) token ids, N a multiple of ``batch``."""
    model.eval()
    right = 0
    for start in range(0, len(images), batch):
        image = model.encode_image(prep(images[start : start + batch]), normalize=True)
        text = model.encode_text(texts[start : start + batch], normalize=True)
        right += int((image @ text.T).argmax(dim=1).eq(torch.arange(len(image))).sum())
    return right / len(images)


def train_clip(
    cfg: SpriteWorldPretrainConfig,
    manifest: Manifest,
    train_records: list[ClipRecord],
    held_out: list[ClipRecord],
    log: Callable[..., None],
) -> dict:
    """Train the CLIP at ``cfg.clip.checkpoint`` (written there atomically, safetensors) for
    ``cfg.clip_training.max_steps`` steps of CLIP's symmetric contrastive loss; returns the summary's numbers:
    first/last loss and held-out image -> caption retrieval accuracy before and after. ``held_out``: captioned clips
    of films it does not train on (at least one)."""
    import open_clip
    from open_clip.loss import ClipLoss
    from safetensors.torch import save_file

    train = cfg.clip_training
    if train.max_steps < 1 or train.batch_size < 2:
        raise ValueError("clip_training needs max_steps >= 1 and batch_size >= 2 (a contrastive batch)")
    if len(train_records) < 2 or not held_out:
        raise ValueError("clip_training needs two captioned training clips and a held-out one")
    with torch.random.fork_rng(devices=[]):  # the VAE and transformer after it draw as they would without it
        torch.manual_seed(cfg.seed)
        model = load_open_clip(cfg.clip).train().requires_grad_(True)
        prep = CLIPImageFeatures(model.visual, cfg.clip.image_size).preprocess  # stage (a)'s resize, crop, norm
        model.train().requires_grad_(True)  # CLIPImageFeatures froze the shared vision tower
        tokenizer = open_clip.get_tokenizer(cfg.clip.arch)

        frames = clip_frames(manifest, train_records, cfg)  # (N, K, 3, H, W)
        texts = _tokens(tokenizer, train_records)  # (N, L)
        batch = min(RETRIEVAL_BATCH, len(held_out))
        test = held_out[: len(held_out) // batch * batch]
        test_images = clip_frames(manifest, test, cfg)[:, 0]  # the first frame, as the encoder's first token group
        test_texts = _tokens(tokenizer, test)
        before = retrieval_accuracy(model, test_images, test_texts, prep, batch)
        model.train()

        optimizer = torch.optim.AdamW(
            model.parameters(), lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay
        )
        lr_scheduler = build_scheduler(optimizer, train)
        loss_fn = ClipLoss()
        rng = np.random.default_rng(cfg.seed)
        losses = []
        progress = tqdm(range(train.max_steps), desc="pretrain clip")
        for step in progress:
            picks = rng.choice(len(frames), min(train.batch_size, len(frames)), replace=False)
            which = rng.integers(0, frames.shape[1], len(picks))
            images = prep(frames[torch.from_numpy(picks), torch.from_numpy(which)])
            image = model.encode_image(images, normalize=True)
            text = model.encode_text(texts[torch.from_numpy(picks)], normalize=True)
            loss = loss_fn(image, text, model.logit_scale.exp())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.max_grad_norm)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                model.logit_scale.clamp_(0, np.log(100))  # CLIP's cap on the temperature
            losses.append(loss.item())
            if (step + 1) % train.log_every == 0 or step + 1 == train.max_steps:
                log(part="clip", step=step + 1, loss=loss.item(), logit_scale=model.logit_scale.exp().item())
                progress.set_postfix(loss=f"{loss.item():.3f}")
        after = retrieval_accuracy(model, test_images, test_texts, prep, batch)

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(cfg.clip.checkpoint) as tmp:
        save_file(state, str(tmp))
    window = max(1, min(10, len(losses)))
    return {
        "clip_loss_first": float(np.mean(losses[:window])),
        "clip_loss_last": float(np.mean(losses[-window:])),
        "clip_retrieval_before": before,
        "clip_retrieval_after": after,
        "clip_retrieval_chance": 1 / batch,
        "clip_retrieval_clips": len(test_images),
    }

