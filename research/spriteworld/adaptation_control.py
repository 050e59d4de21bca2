"""Does decoder adaptation (stage c) do what it is for? A controlled run: an MLLM whose shots carry a known
systematic error, the decoder adapted to it or not.

    python research/spriteworld/adaptation_control.py --config outputs/spriteworld/configs/eval.yaml \\
        --stage-c-config outputs/spriteworld/configs/stage_c.yaml --shrink 0.5 --work outputs/adaptation_control \\
        --out benchmarks/spriteworld/adaptation_control.json max_games=10

The known error is the one a regression trained with a squared loss makes when it underfits: its shots shrink
towards the mean shot. ``--shrink s`` turns a shot x into m + s (x - m), m the mean of the MLLM's cached predictions.

1. Stage (c) as the recipe of ``--stage-c-config`` runs twice into ``--work``: ``exact/`` on the MLLM's predictions
   as they are (it fills the predictions cache), ``shrunk/`` on a copy of that cache with every shot shrunk; same
   seed, steps and data, only the shots differ.
2. On the first ``max_games`` held-out games of the eval config, every turn's shot is the stage (a) encoder's shot
   of the real clip (first frame + caption), exact or shrunk, rendered at the clip's motion level with the turn's
   seed by the stage (a) decoder (``stage_a_checkpoint``: not adapted) and by the two adapted decoders, and scored
   by PSNR against the real clip.

Each row is a (decoder, shots) pair: mean PSNR over turns with its 95 % bootstrap interval over games; the paired
differences that answer the question (adapted to the error minus not adapted, on shrunk shots; and the same on exact
shots, where adaptation has nothing to undo) come with theirs. Writes ``--out`` (JSON).
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.eval.research import games_with_clips, write_report


def add_flags(parser) -> None:
    parser.add_argument("--stage-c-config", required=True, help="the stage (c) recipe to run (a resolved YAML)")
    parser.add_argument("--stage-c-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of the stage (c) config (repeatable), e.g. stage_b_checkpoint=...")
    parser.add_argument("--shrink", type=float, default=0.5, help="shots become m + shrink * (x - m)")
    parser.add_argument("--work", default="outputs/adaptation_control", help="the two stage (c) runs")
    parser.add_argument("--out", default="outputs/adaptation_control.json", help="JSON report")


def shrink_store(source: Path, target: Path, shrink: float) -> torch.Tensor:
    """A copy of the predictions cache ``source`` at ``target`` with every shot shrunk towards their mean; returns
    the mean shot (N, H)."""
    from animegamer.data.stage_c import META_FILE
    from animegamer.data.tensor_store import TensorStore

    store = TensorStore(source)
    ids = store.clip_ids()
    rows = {cid: store.load(cid) for cid in ids}
    mean = torch.stack([row["shot_embeds"].float() for row in rows.values()]).mean(0)
    shutil.rmtree(target, ignore_errors=True)
    out = TensorStore(target)
    for start in range(0, len(ids), 256):
        shard = {}
        for cid in ids[start : start + 256]:
            row = dict(rows[cid])
            row["shot_embeds"] = (mean + shrink * (row["shot_embeds"].float() - mean)).contiguous()
            shard[cid] = row
        out.write_shard(shard)
    shutil.copyfile(source / META_FILE, target / META_FILE)
    return mean


def main(argv: list[str] | None = None) -> dict:
    from animegamer.config import ConfigError, StageCConfig, load_config
    from animegamer.config.recorded import with_decoder_checkpoint
    from animegamer.eval.intervals import bootstrap_interval
    from animegamer.eval.metrics import psnr
    from animegamer.eval.systems import ShotEncoding
    from animegamer.game.build import build_game, resolve_device
    from animegamer.game.turn import turn_seed
    from animegamer.io import resolve_checkpoint
    from animegamer.recipes import stage_c

    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=add_flags)
    if not 0 < args.shrink < 1:
        fail(f"--shrink must be in (0, 1), got {args.shrink}")
    try:
        stage_c_cfg = load_config(args.stage_c_config, args.stage_c_set)
    except (ConfigError, FileNotFoundError) as exc:
        fail(str(exc))
    if not isinstance(stage_c_cfg, StageCConfig):
        fail(f"{args.stage_c_config} is not a stage (c) config")
    if not cfg.stage_a_checkpoint:
        fail("stage_a_checkpoint is empty: the unadapted decoder is stage (a)'s")
    games = games_with_clips(cfg.benchmark, cfg.max_games, "the control needs games with their real clips")

    work = Path(args.work)
    started = time.perf_counter()
    exact, shrunk = work / "exact", work / "shrunk"
    stage_c.main(["--config", args.stage_c_config, *args.stage_c_set, f"output_dir={exact}",
                  f"predictions_cache={exact / 'cache'}"])
    mean = shrink_store(exact / "cache", shrunk / "cache", args.shrink)
    stage_c.main(["--config", args.stage_c_config, *args.stage_c_set, f"output_dir={shrunk}",
                  f"predictions_cache={shrunk / 'cache'}"])
    training_seconds = round(time.perf_counter() - started, 1)

    device = resolve_device(cfg.inference.device)
    torch.manual_seed(cfg.seed)
    encoding = ShotEncoding.from_config(cfg, device)
    turns = []  # (game id, real frames, exact shot, level, seed)
    for game in tqdm(games, desc="shots", unit="game"):
        for index, shot in enumerate(game.shots):
            frames = game.clip_frames(index)
            turns.append((game.game_id, frames, encoding.encode(frames[0], game.caption(index)),
                          shot.values.motion_level, turn_seed(cfg.inference.seed, index)))
    decoders = {"not adapted (stage a)": cfg.stage_a_checkpoint,
                "adapted to exact shots": str(resolve_checkpoint(exact / "checkpoints" / "latest")),
                "adapted to shrunk shots": str(resolve_checkpoint(shrunk / "checkpoints" / "latest"))}
    shot_sets = {"exact": [t[2] for t in turns],
                 "shrunk": [mean + args.shrink * (t[2] - mean) for t in turns]}
    scores: dict[tuple[str, str], list[float]] = {}
    for decoder_name, checkpoint in decoders.items():
        renderer = build_game(with_decoder_checkpoint(cfg.inference, checkpoint), mllm=False).renderer
        for shots_name, shots in shot_sets.items():
            values = []
            for start in tqdm(range(0, len(turns), cfg.render_batch), desc=f"{decoder_name}, {shots_name}"):
                batch = turns[start : start + cfg.render_batch]
                clips = renderer.render_many(shots[start : start + cfg.render_batch], [t[3] for t in batch],
                                             [t[4] for t in batch])
                values += [psnr(clip, t[1]) for clip, t in zip(clips, batch, strict=True)]
            scores[(decoder_name, shots_name)] = values
        del renderer

    def per_game(values: list[float]) -> list[list[float]]:
        grouped = defaultdict(list)
        for (game_id, *_), value in zip(turns, values, strict=True):
            grouped[game_id].append(value)
        return list(grouped.values())

    def summary(values: list[float]) -> dict:
        mean_value, lower, upper = bootstrap_interval(per_game(values))
        return {"mean": round(mean_value, 3), "interval": [round(lower, 3), round(upper, 3)]}

    rows = [{"decoder": d, "shots": s, "psnr": summary(v)} for (d, s), v in scores.items()]
    base = "not adapted (stage a)"
    differences = {
        f"{d} - {base}, {s} shots": summary(list(np.subtract(scores[(d, s)], scores[(base, s)])))
        for d in decoders if d != base for s in shot_sets
    }
    report = {
        "config": {"eval": cfg.benchmark, "games": len(games), "turns": len(turns), "shrink": args.shrink,
                   "stage_c_config": args.stage_c_config, "stage_c_set": args.stage_c_set,
                   "stage_a_checkpoint": cfg.stage_a_checkpoint,
                   "mllm": stage_c_cfg.stage_b_checkpoint, "seed": cfg.inference.seed,
                   "sampling_steps": cfg.inference.sampling.steps},
        "training_seconds": training_seconds,
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
        "differences": differences,
    }
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
