"""Does the decoder draw the friend a shot's words name, or the one its picture shows? The identity swaps (stage (b)'s
identity term, and any name-swap target) are the stage (a) encoder's shots of a clip's first frame with the caption
naming another friend: the picture still shows the old one.

    python research/spriteworld/swap_shots.py --config outputs/spriteworld/configs/eval.yaml max_games=20 \\
        --out benchmarks/spriteworld/swap_shots.json                          # after steps=[data]; ~5 min

For every turn of the held-out games (``benchmark``, ``max_games``) with a friend in view, the real clip's first
frame is encoded with three kinds of (picture, caption) and each shot is drawn by the stage (a) decoder
(``stage_a_checkpoint``, the evaluation's reconstruction path: the turn's level and seed), then scored by the
identity detector (``animegamer/spriteworld/identity.py``):

    real             the real first frame and caption (the reconstruction row's shot)
    words swapped    the real first frame, the caption with each other character named instead of the friend
                     (``animegamer.data.name_swaps``, as many as ``--swaps``): the identity swaps as stored
    both swapped     the first frame drawn again with that character as the friend (``render_shot``, the clip's
                     own seed and settings), with the swapped caption: the shot the encoder makes of such a clip

Per kind: the share of shots whose drawn second character is the friend the caption names, and (for the swaps) the
share that draws the friend the picture shows, each with a 95 % bootstrap interval over games.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.data.name_swaps import rename, swap_pairs
from animegamer.eval.intervals import bootstrap_interval
from animegamer.eval.research import games_with_clips, write_report
from animegamer.eval.systems import load_stage_a_parts
from animegamer.game.turn import turn_seed
from animegamer.spriteworld.animate import render_shot
from animegamer.spriteworld.films import drawing_settings
from animegamer.spriteworld.identity import second_character
from animegamer.spriteworld.world import CHARACTERS, ShotSpec

KINDS = ("real", "words swapped", "both swapped")


def flags(parser) -> None:
    parser.add_argument("--out", required=True, help="the JSON report")
    parser.add_argument("--swaps", type=int, default=2, help="identity swaps per friend turn (pretrain.yaml: 2)")
    parser.add_argument("--batch", type=int, default=8, help="shots drawn at a time")


def friend_swaps(caption: str, hero: str, friend: str, limit: int) -> list[tuple[str, str]]:
    """(new friend, caption naming it instead of ``friend``) for the first ``limit`` identity swaps of ``caption``
    (:func:`~animegamer.data.name_swaps.swap_pairs`, as the features store them) that replace ``friend``."""
    return [(new, rename(caption, old, new)) for old, new in swap_pairs(caption, hero, list(CHARACTERS), limit)
            if old == friend]


def redraw_first_frame(source: dict, old: str, new: str) -> np.ndarray:
    """The first frame of a turn's real clip drawn again with ``new`` wherever ``old`` was the friend or companion."""
    spec = dict(source["spec"])
    if spec.get("friend") == old:
        spec["friend"] = new
    settings = drawing_settings(source)
    if settings.get("companion") == old:
        settings["companion"] = new
    return render_shot(ShotSpec(**spec), int(source["render_seed"]), **settings)[0]


def summarise(per_game: dict[str, list[list[float]]]) -> dict | None:
    games = [values for values in per_game if values]
    if not games:
        return None
    mean, low, high = bootstrap_interval(games)
    return {"turns": sum(map(len, games)), "mean": mean, "low": low, "high": high}


def main(argv: list[str] | None = None) -> dict:
    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=flags)
    if args.swaps < 1 or args.batch < 1:
        fail(f"--swaps={args.swaps} and --batch={args.batch} must be >= 1")
    if not cfg.stage_a_checkpoint:
        fail("stage_a_checkpoint is empty: the shots need the trained stage (a) encoder and decoder")
    games = games_with_clips(cfg.benchmark, cfg.max_games, "needs SpriteWorld games with their real clips")
    torch.manual_seed(cfg.seed)
    try:
        encoding, renderer = load_stage_a_parts(cfg)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))

    named = {kind: [] for kind in KINDS}  # per game: 1 when the drawn friend is the one the caption names
    pictured = {kind: [] for kind in KINDS[1:]}  # per game: 1 when it is the one the (real) picture shows
    started = time.perf_counter()
    for game in tqdm(games, desc="games", unit="game"):
        jobs = []  # (kind, hero, friend the caption names, friend the real frame shows, shot, level, seed)
        for turn in range(len(game.instructions)):
            cast = game.cast(turn)
            if cast is None:
                fail(f"{game.path}: not a SpriteWorld game (its turns have no shot spec)")
            if not cast.friend:
                continue
            first, caption = game.clip_frames(turn)[0], game.caption(turn)
            level, seed = game.shots[turn].values.motion_level, turn_seed(cfg.seed, turn)
            jobs.append(("real", cast, cast.friend, encoding.encode(first, caption), level, seed))
            for new, text in friend_swaps(caption, cast.hero, cast.friend, args.swaps):
                jobs.append(("words swapped", cast, new, encoding.encode(first, text), level, seed))
                redrawn = redraw_first_frame(game.clips[turn], cast.friend, new)
                jobs.append(("both swapped", cast, new, encoding.encode(redrawn, text), level, seed))
        scores = {kind: [] for kind in KINDS}
        shown = {kind: [] for kind in KINDS[1:]}
        for start in range(0, len(jobs), args.batch):
            batch = jobs[start : start + args.batch]
            frames = renderer.render_many([j[3] for j in batch], [j[4] for j in batch], [j[5] for j in batch])
            for (kind, cast, wanted, *_), clip in zip(batch, frames, strict=True):
                drawn = second_character(np.asarray(clip), cast.hero, cast.scenery)
                scores[kind].append(float(drawn == wanted))
                if kind in shown:
                    shown[kind].append(float(drawn == cast.friend))
        for kind in KINDS:
            named[kind].append(scores[kind])
        for kind in shown:
            pictured[kind].append(shown[kind])

    rows = [{"shot": kind, "draws": "the friend the caption names", **(summarise(named[kind]) or {})}
            for kind in KINDS]
    rows += [{"shot": kind, "draws": "the friend the real picture shows", **(summarise(pictured[kind]) or {})}
             for kind in KINDS[1:]]
    command = " ".join(["python", "research/spriteworld/swap_shots.py", *(argv if argv is not None else sys.argv[1:])])
    report = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": f"CPU, {torch.get_num_threads()} torch threads", "torch": torch.__version__,
              "seconds": round(time.perf_counter() - started, 1), "games": len(games),
              "stage_a_checkpoint": cfg.stage_a_checkpoint, "rows": rows}
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
