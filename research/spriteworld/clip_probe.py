"""Does pretraining the stand-in CLIP make its tokens say who the friend is? A linear probe, random vs pretrained.

    python research/spriteworld/clip_probe.py --config outputs/spriteworld/configs/pretrain.yaml \\
        clip_training.max_steps=1500 --work outputs/clip_probe --out benchmarks/spriteworld/clip_probe.json

The CLIP of ``--config`` (the stand-in stage (a) reads: tiny, random, frozen) is copied to ``--work`` and trained
there by :func:`animegamer.spriteworld.pretrain_clip.train_clip` (``clip_training`` of the config: CLIP's
contrastive loss on the training films' frames and captions). At the first frame of every captioned clip with a
friend in view, three features are kept:

- ``pixels``: the frame as the CLIP sees it (resized, centre-cropped, normalised; what any encoder could keep);
- ``clip_random``: the random stand-in's tokens (``clip.layer``, as stage (a) stores them);
- ``clip_pretrained``: the pretrained copy's tokens.

Each is read by the linear ridge probe of ``identity_probes.py`` in grouped cross-validation over films; accuracy
with its 95 % bootstrap interval over films, and the majority class's. The report also has the pretraining's
summary (losses, held-out caption retrieval before and after). Writes ``--out`` (JSON).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import SpriteWorldPretrainConfig
from animegamer.eval.research import write_report
from research.spriteworld.identity_probes import probe_accuracy


def add_flags(parser) -> None:
    parser.add_argument("--work", default="outputs/clip_probe", help="folder of the pretrained copy of the CLIP")
    parser.add_argument("--out", default="outputs/clip_probe.json", help="JSON report")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds over films")
    parser.add_argument("--l2", type=float, default=1e-2, help="ridge weight of the probes, per standardised feature")


@torch.no_grad()
def tokens(clip, frames: torch.Tensor, batch: int = 64) -> np.ndarray:
    """(N, 3, H, W) uint8 -> (N, Nc * Dc) flattened tokens."""
    return torch.cat([clip(frames[i : i + batch]).flatten(1) for i in range(0, len(frames), batch)]).numpy()


def main(argv: list[str] | None = None) -> dict:
    from animegamer.data.manifest import ManifestError, read_manifest
    from animegamer.models.clip_image import CLIPImageFeatures
    from animegamer.spriteworld import CHARACTERS
    from animegamer.spriteworld.pretrain_clip import clip_frames, train_clip

    cfg, args = parse_config(SpriteWorldPretrainConfig, __doc__, argv, extra=add_flags)
    if args.folds < 2 or args.l2 < 0:
        fail(f"--folds must be 2 or more and --l2 0 or more, got {args.folds}, {args.l2}")
    if cfg.clip_training.max_steps < 1:
        fail("clip_training.max_steps must be 1 or more: the probe compares the random CLIP with a pretrained copy")
    for path in (cfg.clip.checkpoint, cfg.clip.model_config, cfg.data.manifest):
        if not Path(path).is_file():
            fail(f"{path} not found")
    try:
        manifest = read_manifest(cfg.data.manifest)
    except ManifestError as exc:
        fail(str(exc))
    train_films = set(manifest.meta.get("splits", {}).get("train", []))
    if not train_films:
        fail(f"{cfg.data.manifest} has no train/test split (a SpriteWorld manifest has)")
    captioned = [r for r in manifest.records if r.tags]
    train = [r for r in captioned if r.film_id in train_films]
    held_out = [r for r in captioned if r.film_id not in train_films]
    friends = [r for r in captioned if (r.extra or {}).get("friend") or (r.extra or {}).get("companion")]
    if not friends or not held_out:
        fail(f"{cfg.data.manifest}: no clips with a friend in view, or no held-out film")
    names = list(CHARACTERS)
    labels = np.array([names.index(r.extra.get("friend") or r.extra["companion"]) for r in friends])
    films = [r.film_id for r in friends]

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    copy = work / Path(cfg.clip.checkpoint).name
    shutil.copyfile(cfg.clip.checkpoint, copy)
    trained_cfg = dataclasses.replace(cfg, clip=dataclasses.replace(cfg.clip, checkpoint=str(copy)))
    started = time.perf_counter()
    log_rows = []
    summary = train_clip(trained_cfg, manifest, train, held_out, lambda **row: log_rows.append(row))
    seconds = round(time.perf_counter() - started, 1)

    first = clip_frames(manifest, friends, cfg)[:, 0]  # (N, 3, H, W) uint8, the first frame
    random_clip = CLIPImageFeatures.from_config(cfg.clip)
    pretrained_clip = CLIPImageFeatures.from_config(trained_cfg.clip)
    features = {
        "pixels": torch.cat([random_clip.preprocess(first[i : i + 64]).flatten(1)
                             for i in range(0, len(first), 64)]).numpy(),
        "clip_random": tokens(random_clip, first),
        "clip_pretrained": tokens(pretrained_clip, first),
    }
    probes = {name: probe_accuracy(x, labels, films, len(names), args.folds, args.l2)
              for name, x in tqdm(features.items(), desc="probes")}
    report = {
        "config": {"clip": cfg.clip.checkpoint, "manifest": cfg.data.manifest, "seed": cfg.seed,
                   "clip_training": dataclasses.asdict(cfg.clip_training), "folds": args.folds, "l2": args.l2},
        "friend_clips": len(friends),
        "films": len(set(films)),
        "pretraining": {**summary, "seconds": seconds},
        "probes": probes,
    }
    write_report(args.out, report)
    for name, row in probes.items():
        print(f"{name:16s} {row['accuracy']:.3f} [{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]  "
              f"majority {row['majority']:.3f}")
    return report


if __name__ == "__main__":
    main()
