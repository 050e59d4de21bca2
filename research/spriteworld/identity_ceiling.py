"""Where the characters' colours are lost on the way to the screen: the identity columns of the real clips, at the
decoder's size, and after the VAE alone, with 95 % intervals over games.

    python research/spriteworld/identity_ceiling.py --config outputs/spriteworld/configs/eval.yaml \\
        --out benchmarks/spriteworld/identity_ceiling.json                       # after steps=[data]; ~2 min

The identity columns (``animegamer/spriteworld/identity.py``: Friend-N, Friend-R, Hero) of every turn of the
evaluation's held-out games (``benchmark``, ``max_games``), for three versions of the turn's real clip:

    real             the clip as drawn (the detector's own check: every value 1)
    decoder size     resized to the sampler's frames and size (``inference.sampling``), as the evaluation compares
    VAE round trip   that clip encoded and decoded by the decoder's VAE (``inference.decoder.pretrained``): the
                     best any shot, any sampler can draw through this VAE

and, per character, how far the VAE moves its shirt colour: over the pixels of the resized real clips within the
detector's tolerance of a shirt colour, the mean RGB distance of the decoded pixel to that colour and the fraction
still within the tolerance. A column that drops at the VAE round trip is lost by the autoencoder; one that holds
there and drops in stage (a) reconstruction (the evaluation's ``reconstruction`` system) is lost by the shot or the
transformer.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.data.features import fit_frames
from animegamer.eval.intervals import bootstrap_interval
from animegamer.eval.research import games_with_clips, write_report
from animegamer.models.vae import load_vae, vae_decode, vae_encode
from animegamer.spriteworld.identity import TOLERANCE
from animegamer.spriteworld.world import CHARACTERS

COLUMNS = {"friend_named": "Friend-N", "friend_remembered": "Friend-R", "hero_on_screen": "Hero"}
VERSIONS = ("real", "decoder size", "VAE round trip")


def flags(parser) -> None:
    parser.add_argument("--out", required=True, help="the JSON report")
    parser.add_argument("--batch", type=int, default=12, help="clips through the VAE at a time")


def shirt_drift(truth: np.ndarray, decoded: np.ndarray) -> dict[str, tuple[float, int, int]]:
    """Per character: (summed RGB distance of ``decoded`` to the shirt colour, pixels still within the tolerance,
    pixels) over the pixels of ``truth`` within the tolerance of that shirt colour. Both (T, H, W, 3) uint8."""
    real, out = truth.astype(np.float32), decoded.astype(np.float32)
    sums = {}
    for name, character in CHARACTERS.items():
        colour = np.asarray(character.top, np.float32)
        where = np.linalg.norm(real - colour, axis=-1) < TOLERANCE
        distance = np.linalg.norm(out[where] - colour, axis=-1)
        sums[name] = (float(distance.sum()), int((distance < TOLERANCE).sum()), int(where.sum()))
    return sums


def column_rows(per_game: dict[str, dict[str, list[list[float]]]]) -> list[dict]:
    """One row per (version, column) with the mean over turns and its bootstrap interval over games."""
    rows = []
    for version, columns in per_game.items():
        for key, label in COLUMNS.items():
            games = [values for values in columns.get(key, []) if values]
            if not games:
                continue
            mean, low, high = bootstrap_interval(games)
            rows.append({"version": version, "column": label, "turns": sum(map(len, games)), "mean": mean,
                         "low": low, "high": high})
    return rows


def main(argv: list[str] | None = None) -> dict:
    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=flags)
    if args.batch < 1:
        fail(f"--batch={args.batch} must be >= 1")
    games = games_with_clips(cfg.benchmark, cfg.max_games, "needs SpriteWorld games with their real clips")
    sampling = cfg.inference.sampling
    try:
        vae = load_vae(cfg.inference.decoder)
    except FileNotFoundError as exc:
        fail(str(exc))

    per_game: dict[str, dict[str, list[list[float]]]] = {v: {k: [] for k in COLUMNS} for v in VERSIONS}
    drift = {name: [0.0, 0, 0] for name in CHARACTERS}
    started = time.perf_counter()
    for game in tqdm(games, desc="games", unit="game"):
        casts = [game.cast(t) for t in range(len(game.instructions))]
        if any(cast is None for cast in casts):
            fail(f"{game.path}: not a SpriteWorld game (its turns have no shot spec)")
        real = [game.clip_frames(t) for t in range(len(casts))]
        sized = [fit_frames(frames, sampling.num_frames, sampling.height, sampling.width) for frames in real]
        decoded = []
        for start in range(0, len(sized), args.batch):
            batch = torch.stack(sized[start : start + args.batch])
            decoded += list(vae_decode(vae, vae_encode(vae, batch)).numpy())
        scored = {"real": [c.score(f) for c, f in zip(casts, real, strict=True)],
                  "decoder size": [c.score(f.numpy()) for c, f in zip(casts, sized, strict=True)],
                  "VAE round trip": [c.score(f) for c, f in zip(casts, decoded, strict=True)]}
        for version, values in scored.items():
            for key in COLUMNS:
                per_game[version][key].append([v[key] for v in values if key in v])
        for truth, out in zip(sized, decoded, strict=True):
            for name, (distance, kept, pixels) in shirt_drift(truth.numpy(), out).items():
                drift[name][0] += distance
                drift[name][1] += kept
                drift[name][2] += pixels

    shirts = {name: {"pixels": pixels, "mean_distance": distance / pixels if pixels else None,
                     "within_tolerance": kept / pixels if pixels else None}
              for name, (distance, kept, pixels) in drift.items()}
    command = " ".join(["python", "research/spriteworld/identity_ceiling.py", *(argv or sys.argv[1:])])
    report = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": f"CPU, {torch.get_num_threads()} torch threads", "torch": torch.__version__,
              "seconds": round(time.perf_counter() - started, 1), "games": len(games),
              "turns": sum(len(g.instructions) for g in games), "tolerance": TOLERANCE,
              "frames": [sampling.num_frames, sampling.height, sampling.width],
              "rows": column_rows(per_game), "shirts_after_vae": shirts}
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
