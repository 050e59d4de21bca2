"""SpriteWorld's stand-in for CogVideoX-2B pretraining: the frozen T5, VAE and base transformer that stage (a)
fine-tunes (``scripts/spriteworld/pretrain.py`` runs :func:`pretrain`).

Stage (a) trains LoRA on top of a *pretrained* text-to-video CogVideoX. No such weights can be downloaded here, and a
random tiny CogVideoX draws noise, so this plays the part of the pretraining, on SpriteWorld's training films:

1. the frozen text encoder: a tiny random T5 (seeded, never trained, as the issue asks) + sentencepiece tokenizer,
   written to ``output_dir/{text_encoder,tokenizer}`` by :func:`animegamer.tiny.build_tiny_t5`; the tokenizer's
   corpus holds every SpriteWorld word (:func:`animegamer.spriteworld.world.lexicon`), so each is one token and a
   caption's place always sits at the same token positions (split into letters, "noon" took 4 and moved the place
   of the caption by up to 10 positions, which the MLLM, predicting the shot token by token, could not follow).
   With ``clip_training.max_steps`` > 0 the stand-in CLIP at ``clip.checkpoint`` is then pretrained with CLIP's
   contrastive loss on the training films' frames and captions (:mod:`animegamer.spriteworld.pretrain_clip`;
   rewritten in place, from its own seeded generators, so nothing below draws differently); 0 leaves it random;
2. the VAE, ``output_dir/vae/`` (:mod:`animegamer.spriteworld.pretrain_vae`). ``resume_vae=true`` keeps the VAE
   (and the features of step 3, filled again if the CLIP was just trained) of an earlier run and trains the
   transformer only, provided that run finished both (``report_dir/summary.json`` vouches for the pair only then;
   model folders are written to a temp folder and renamed in, never left half-saved);
3. the stage (a) features of every clip of ``data.manifest`` in ``data.features_dir``
   (:func:`animegamer.spriteworld.pretrain_transformer.fill_features`; with ``data.identity_swaps`` also the T5
   tokens of each friend clip's caption with another character named, for stage (b)'s identity term);
4. the base transformer, ``output_dir/transformer/`` (from ``init_transformer``'s weights when it names a folder:
   more steps for a trained one; ``transformer_cycles`` runs its schedule that many times, warm restarts), and
   CogVideoX-2B's scheduler config, ``output_dir/scheduler/``
   (:mod:`animegamer.spriteworld.pretrain_transformer`).

``output_dir`` is then a whole diffusers CogVideoX folder (``model_index.json`` included) for ``decoder.pretrained``
and ``t5.path``. ``report_dir`` gets ``metrics.jsonl`` (both losses), ``config.yaml``, ``summary.json``,
``vae_reconstruction.png`` (ground truth above reconstruction) and ``samples.png`` (text-to-video samples of
held-out captions above their real clips).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from animegamer.config import SpriteWorldPretrainConfig, T5Config, to_yaml
from animegamer.data.manifest import ManifestError, read_manifest
from animegamer.data.tensor_store import TensorStore
from animegamer.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from animegamer.models.t5_text import T5TextFeatures
from animegamer.spriteworld.memory import lexicon
from animegamer.spriteworld.pretrain_clip import train_clip
from animegamer.spriteworld.pretrain_transformer import fill_features, init_weights, sample_preview, train_transformer
from animegamer.spriteworld.pretrain_vae import (
    empty_scenery,
    read_clips,
    set_scaling_factor,
    train_vae,
    vae_preview,
)
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER, build_tiny_t5, write_model_index
from animegamer.training.checkpoint import write_dir_atomically

PREVIEW_CLIPS = 6


class Log:
    """Loss lines in ``report_dir/metrics.jsonl`` (rewritten atomically as they grow)."""

    def __init__(self, path: Path):
        self.path, self.rows = path, []

    def __call__(self, **row) -> None:
        self.rows.append(row)
        atomic_write_jsonl(self.path, self.rows)


def mean_of(rows: list[dict], part: str, first: bool, count: int = 10) -> float:
    """Mean loss of the first (or last) ``count`` logged rows of ``part`` (vae | transformer)."""
    losses = [r["loss"] for r in rows if r["part"] == part]
    window = losses[:count] if first else losses[-count:]
    return float(np.mean(window)) if window else float("nan")



def pretrain(cfg: SpriteWorldPretrainConfig) -> Path:
    """Steps 1-4 (module doc) into ``output_dir`` (a diffusers CogVideoX folder) and ``report_dir``; returns
    ``output_dir``. A manifest without captioned training clips raises ManifestError, an ``init_transformer`` that
    is not this architecture's weights InitTransformerError."""
    from diffusers import CogVideoXDDIMScheduler

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    init = init_weights(cfg)  # a bad init_transformer fails here, before anything is written
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
        raise ManifestError(f"no captioned training clips in {cfg.data.manifest}")

    # 1. frozen tiny T5 (random, seeded) + tokenizer
    out.mkdir(parents=True, exist_ok=True)
    back = bool(manifest.meta.get("config", {}).get("back", False))  # the data's world says "back"
    build_tiny_t5(out, seed=cfg.seed, d_model=cfg.t5_dim, words=lexicon(back))
    t5 = T5TextFeatures.from_config(T5Config(path=str(out), max_length=cfg.text_tokens))

    # 1b. the stand-in CLIP, pretrained contrastively on the training films (clip_training.max_steps > 0)
    earlier = json.loads((report / "summary.json").read_text()) if (report / "summary.json").is_file() else {}
    clip_summary = {}
    if cfg.clip_training.max_steps > 0:
        clip_summary = train_clip(cfg, manifest, train_records, held_out, log)
        print(f"clip: held-out retrieval {clip_summary['clip_retrieval_before']:.3f} -> "
              f"{clip_summary['clip_retrieval_after']:.3f} (chance {clip_summary['clip_retrieval_chance']:.3f})")

    # 2. VAE, and 3. the stage (a) features of every clip from it (kept from an earlier run if resume_vae; the
    # features are filled again when the CLIP was just trained: theirs came from another one)
    store = TensorStore(cfg.data.features_dir)
    if cfg.resume_vae and (out / "vae" / "config.json").is_file() and "vae_psnr_db" in earlier and len(store):
        print(f"vae: kept {out / 'vae'} and the features in {cfg.data.features_dir} (resume_vae=true)")
        lines = (report / "metrics.jsonl").read_text().splitlines() if (report / "metrics.jsonl").is_file() else []
        log.rows = [row for row in map(json.loads, lines) if row["part"] == "vae"] + log.rows  # + this run's clip
        psnr, scale = earlier["vae_psnr_db"], earlier["vae_scaling_factor"]
        if clip_summary:
            from diffusers import AutoencoderKLCogVideoX

            vae = AutoencoderKLCogVideoX.from_pretrained(str(out / "vae")).eval().requires_grad_(False)
            store = fill_features(cfg, vae, manifest, t5)
            print(f"features: {len(store)} clips in {cfg.data.features_dir} (the new CLIP's tokens)")
    else:
        clips = read_clips(manifest, train_records, cfg)
        vae = train_vae(cfg, clips, log, empty_scenery(train_records, cfg.data.height, cfg.data.width))
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
        store = fill_features(cfg, vae, manifest, t5)
        print(f"features: {len(store)} clips in {cfg.data.features_dir}")
        atomic_write_json(report / "summary.json", {**kept, "vae_psnr_db": psnr, "vae_scaling_factor": scale})

    # 4. base text-to-video transformer
    empty = t5([""])[0]  # (Nt, Dt): the unconditional prompt
    transformer = train_transformer(cfg, store, [r.clip_id for r in train_records], empty, log, init)
    write_dir_atomically(out / "transformer", lambda tmp: transformer.save_pretrained(str(tmp)))
    scheduler = CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER)
    write_dir_atomically(out / "scheduler", lambda tmp: scheduler.save_pretrained(str(tmp)))
    write_model_index(out)
    picks = np.random.default_rng(cfg.seed).choice(len(held_out), min(PREVIEW_CLIPS, len(held_out)), replace=False)
    sheet = sample_preview(cfg, store, manifest, [held_out[i] for i in sorted(picks)], report / "samples.png")

    summary = {
        **clip_summary,
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
