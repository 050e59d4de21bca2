"""How close the fast samplers come to the teacher: stage (d) students, the same calls undistilled, the cache hooks.

    python research/teacher_agreement.py --config configs/spriteworld/inference.yaml \\
        decoder_checkpoint=checkpoints/spriteworld/stage_c \\
        --students outputs/stage_d_1/checkpoints/latest outputs/stage_d_2/checkpoints/latest \\
                   checkpoints/spriteworld/stage_d \\
        --games outputs/spriteworld/data/games --out outputs/spriteworld/agreement
    python research/teacher_agreement.py --config configs/tiny/inference.yaml --games GAMES --out OUT   # no students

``decoder_checkpoint`` is the teacher (the adapted stage (c) decoder the students were distilled from); its sampler
is the one the students' ``sampler.json`` records (N guided DDIM steps), or the config's ``sampling`` without
students. The MLLM of the config plays every held-out game of ``--games`` (a games directory, a benchmark directory
or a clip manifest, as scripts/evaluate.py reads them; K = ``history_turns``) to get each turn's shot representation
and motion level; then every sampler renders every turn from the same seeded noise and is compared with the
teacher's clip (animegamer.bench.agreement): transformer calls per turn, relative L2 of the latents, PSNR / SSIM of
the frames to the teacher's with 95 % bootstrap intervals over games, and the paired gain of each K-step student
over the teacher's decoder at the same K timesteps without CFG. MagCache uses ``sampling.magcache_ratios`` when
set (made for the teacher's step count), else ratios calibrated on the first game.

Writes ``<out>/teacher_agreement.json`` (every number, per turn) and ``<out>/teacher_agreement.md`` atomically.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tqdm.auto import tqdm

from animegamer.bench.agreement import Condition, Student, teacher_agreement, teacher_sampling, write_agreement
from animegamer.cli import fail, no_bars_in_logs, parse_config
from animegamer.config import InferenceConfig
from animegamer.eval.games import load_games
from animegamer.game.build import build_game, check_checkpoints, resolve_device
from animegamer.game.turn import turn_seed
from animegamer.io import checkpoint_decoder_dir
from animegamer.models.trained import load_decoder
from animegamer.sampling.cache import CACHE_METHODS, MagRatios
from animegamer.sampling.fewstep import FewStepSampler

CACHES = tuple(m for m in CACHE_METHODS if m != "none")


def main(argv: list[str] | None = None) -> tuple[Path, Path]:
    def flags(parser):
        parser.add_argument("--games", required=True, help="held-out games: games dir, benchmark dir or clips.jsonl")
        parser.add_argument("--out", required=True, help="directory for teacher_agreement.json and .md")
        parser.add_argument("--students", nargs="*", default=[], help="stage (d) checkpoints (one per step count)")
        parser.add_argument("--undistilled", nargs="*", type=int, default=[1, 2, 4],
                            help="step counts of the teacher's decoder without CFG or distillation (default 1 2 4)")
        parser.add_argument("--caches", nargs="*", default=list(CACHES), choices=CACHES,
                            help="cache hooks on the teacher's sampler (default: all)")
        parser.add_argument("--max-games", type=int, default=0, help="the first N games (0: all)")

    cfg, args = parse_config(InferenceConfig, __doc__, argv, extra=flags)
    no_bars_in_logs()
    if any(k < 1 for k in args.undistilled) or args.max_games < 0:
        fail(f"--undistilled step counts must be >= 1 and --max-games >= 0, got {args.undistilled}, {args.max_games}")
    if not cfg.decoder_checkpoint:
        fail("decoder_checkpoint= must name the teacher (the stage (c) decoder the students were distilled from)")
    cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, preset="standard", cache="none"))
    device = resolve_device(cfg.device)
    try:
        check_checkpoints(cfg)
        games = load_games(args.games, args.max_games)
        # CogVideoX's 1000 training timesteps bound the students' timesteps (checked before any model loads)
        samplers = [(path, FewStepSampler.load(checkpoint_decoder_dir(path), 1000)) for path in args.students]
        steps = [sampler.steps for _, sampler in samplers]
        if len(set(steps)) < len(steps):
            raise ValueError(f"--students: one checkpoint per step count, got step counts {steps}")
        teacher = load_decoder(cfg.decoder_checkpoint, cfg.decoder, device=device)
        students = [Student(path, load_decoder(path, cfg.decoder, device=device), sampler)
                    for path, sampler in samplers]
        sampling = teacher_sampling(cfg.sampling, students)
        ratios = None
        if "magcache" in args.caches and cfg.sampling.magcache_ratios:
            ratios = MagRatios.load(cfg.sampling.magcache_ratios, sampling.steps)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))

    animegamer = build_game(dataclasses.replace(cfg, device=device, offload="none"), render=False)
    conditions = []
    for g, game in enumerate(tqdm(games, desc="MLLM games", disable=None)):
        turns = []
        for instruction in game.instructions:
            turn = animegamer.play_turn(turns, instruction.render())
            turns.append(turn)
            conditions.append(Condition(g, turn.index, turn.shot_embeds, turn.values.motion_level,
                                        turn_seed(cfg.seed, 1000 * g + turn.index)))
    rows = 1 + len(students) + len(args.undistilled) + len(args.caches)
    with torch.no_grad(), tqdm(total=rows * len(conditions), desc="rendering", disable=None) as bar:
        result = teacher_agreement(teacher, students, conditions, sampling, tuple(args.undistilled),
                                   tuple(args.caches), ratios, progress=lambda: bar.update())
    result["settings"] = {"config": args.config, "decoder_checkpoint": cfg.decoder_checkpoint,
                          "mllm_checkpoint": cfg.mllm_checkpoint, "games": args.games, "max_games": args.max_games,
                          "history_turns": cfg.history_turns, "seed": cfg.seed,
                          "clip": [cfg.sampling.num_frames, cfg.sampling.height, cfg.sampling.width]}
    paths = write_agreement(result, args.out)
    print(Path(paths[1]).read_text())
    print(f"wrote {paths[0]} and {paths[1]}")
    return paths


if __name__ == "__main__":
    main()
