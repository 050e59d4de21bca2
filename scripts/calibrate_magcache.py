"""Calibrate MagCache for a decoder and its sampler: the magnitude ratios ``sampling.cache: magcache`` reads.

    python scripts/calibrate_magcache.py --config configs/spriteworld/inference.yaml --out outputs/magcache
    python scripts/calibrate_magcache.py --config configs/inference.yaml --out outputs/magcache sampling.preset=fast

then play with the same decoder and sampling settings plus
``sampling.cache=magcache sampling.magcache_ratios=<out>/magcache_ratios.json``.

MagCache skips the transformer blocks at a step when the blocks' residual is predicted to change little, and it
predicts that from a ratio per step (mean over tokens of |residual_t| / |residual_t-1|) that depends on the model and
the sampler, hardly on the shot. This script measures those ratios: the MLLM plays the first ``--prompts``
instructions of the config's ``game`` file (no rendering) to get real shot representations and motion levels, then
the configured sampler (``sampling.preset``, steps, guidance; ``sampling.cache`` is ignored) samples each shot under
diffusers' MagCache hook in calibration mode, which skips nothing and records one ratio per transformer call.

Writes ``<out>/magcache_ratios.json`` atomically: ``ratios`` (the mean over the prompts, one per transformer call of
a clip: the sampler's step count, guided steps batch both branches in one call), the sampler, the decoder and the
per-prompt ratios. A ratios file made for another step count is refused when played.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, no_bars_in_logs, parse_config
from animegamer.config import InferenceConfig
from animegamer.game.build import build_game
from animegamer.game.turn import turn_seed
from animegamer.sampling.cache import MagRatios, calibrate_mag_ratios
from animegamer.states import TagError, read_game_file

RATIOS_FILE = "magcache_ratios.json"


def main(argv: list[str] | None = None) -> Path:
    def flags(parser):
        parser.add_argument("--out", required=True, help=f"directory to write {RATIOS_FILE} into")
        parser.add_argument("--prompts", type=int, default=4, help="instructions of the game file to calibrate on")

    cfg, args = parse_config(InferenceConfig, __doc__, argv, extra=flags)
    no_bars_in_logs()
    if args.prompts < 1:
        fail(f"--prompts must be at least 1, got {args.prompts}")
    cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, cache="none"))
    try:
        instructions = read_game_file(cfg.game)[: args.prompts]
        animegamer = build_game(cfg)
    except (FileNotFoundError, ValueError, TagError) as exc:  # before or instead of loading any model
        fail(str(exc))
    renderer = animegamer.renderer
    sampler = renderer.sampler
    turns = []
    for instruction in tqdm(instructions, desc="MLLM turns", disable=None):
        turns.append(animegamer.play_turn(turns, instruction.render(), render=False))

    def clips():
        for turn in tqdm(turns, desc="calibrating", disable=None):
            def sample(turn=turn):
                shot = turn.shot_embeds[None].to(renderer.decoder.dtype)  # (1, N, H)
                generator = torch.Generator().manual_seed(turn_seed(cfg.seed, turn.index))
                return sampler.latents(shot, torch.tensor([turn.values.motion_level]), generator)
            yield sample

    calls = sampler.sampling.steps  # one transformer call per step (a guided step runs both branches in one)
    with torch.no_grad():
        per_prompt = calibrate_mag_ratios(renderer.decoder.transformer, calls, clips())
    mean = [sum(column) / len(column) for column in zip(*per_prompt, strict=True)]
    ratios = MagRatios(tuple(mean), sampler.description, {
        "decoder_pretrained": cfg.decoder.pretrained, "decoder_checkpoint": cfg.decoder_checkpoint,
        "sampling": dataclasses.asdict(cfg.sampling),
        "prompts": [t.instruction for t in turns], "per_prompt": per_prompt,
    })
    path = ratios.save(Path(args.out) / RATIOS_FILE)
    print(f"{path}: {calls} ratios ({sampler.description}), mean over {len(per_prompt)} prompts; play with "
          f"sampling.cache=magcache sampling.magcache_ratios={path}")
    return path


if __name__ == "__main__":
    main()
