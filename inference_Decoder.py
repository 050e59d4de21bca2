"""Render the clips of a game played by inference_MLLM.py: one mp4 + gif per turn, the whole game, a contact sheet.

    python inference_MLLM.py --config configs/spriteworld/inference.yaml     # CPU, the shipped SpriteWorld world
    python inference_Decoder.py --config configs/spriteworld/inference.yaml  # (the two = make demo)
    python inference_Decoder.py --config configs/inference.yaml              # full size, converted weights

Reads ``output_dir`` (the MLLM results: game.json, turn_XXX/shot_embeds.safetensors, turn_XXX/state.json) and
writes beside them::

    output_dir/turn_000/clip.mp4, clip.gif     each turn's clip (decoder seed derived from the game seed and turn)
    output_dir/game.mp4                        all turns one after another
    output_dir/contact_sheet.png               a row per turn: frames, the whole instruction, values and state
    output_dir/turn_000/clip_x4.mp4, game_x4.mp4   the same enlarged by nearest neighbour (clips under 256 rows;
                                               the factor is in the name) for people to look at

``decoder_checkpoint`` is a stage (c) or (a) checkpoint; ``fast=true`` uses the fast sampling preset.
The results are untrusted input: every turn directory must lie inside ``output_dir`` (symlinks followed) and every
file must be what inference_MLLM.py writes; a missing checkpoint or a bad file stops the run with one line, before
the decoder loads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from animegamer.cli import fail, no_bars_in_logs, parse_config
from animegamer.config import InferenceConfig
from animegamer.data.video import write_gif, write_mp4
from animegamer.inference.contact_sheet import contact_sheet, readable_factor, state_bar, upscale
from animegamer.inference.game import turn_seed
from animegamer.inference.mllm_runner import load_results
from animegamer.inference.session import check_checkpoints, resolve_device
from animegamer.official.game import load_renderer, render_levels


def main(argv: list[str] | None = None) -> dict[str, Path]:
    cfg, _ = parse_config(InferenceConfig, __doc__, argv)
    no_bars_in_logs()
    out = Path(cfg.output_dir)
    try:  # everything that can be wrong with the input, before any weights are read
        check_checkpoints(cfg, mllm=False)
        game, turns = load_results(out)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if not turns:
        fail(f"{out}/game.json lists no turns")
    try:  # compat released: the level the release parsed, through its own table
        levels = render_levels(cfg, [state for state, _ in turns])
    except ValueError as exc:
        fail(f"{out}: {exc}")
    device = resolve_device(cfg.device)
    renderer = load_renderer(cfg, device, offload=cfg.offload == "sequential" and device != "cpu")
    seed = int(game.get("seed", cfg.seed))
    factor = readable_factor(cfg.sampling.height)

    all_frames, rows = [], []
    for (state, shot_embeds), level in tqdm(list(zip(turns, levels, strict=True)), desc="render turns", disable=None):
        index = state["turn"]  # (no bar in a log file)
        frames = renderer.render(shot_embeds, level, turn_seed(seed, index))
        folder = out / f"turn_{index:03d}"
        write_mp4(folder / "clip.mp4", frames, fps=renderer.fps)
        write_gif(folder / "clip.gif", frames, fps=renderer.fps)
        if factor > 1:
            write_mp4(folder / f"clip_x{factor}.mp4", upscale(frames, factor), fps=renderer.fps)
        all_frames.append(frames)
        v, s = state["values"], state["character_state"]
        rows.append((frames, [
            f"turn {index}: {state['instruction']}",
            f"level {v['motion_level']}  social {v['social']}  ent {v['entertainment']}  stamina {v['stamina']:+d}",
            state_bar("stamina", s["stamina"], 12),
            state_bar("social", s["social"], 12),
            state_bar("entertainment", s["entertainment"], 12),
        ]))
    written = {
        "clips": out / "turn_000" / "clip.mp4",
        "game": write_mp4(out / "game.mp4", np.concatenate(all_frames), fps=renderer.fps),
        "contact_sheet": contact_sheet(rows, out / "contact_sheet.png", scale=min(factor, 2)),
    }
    if factor > 1:
        written["game_upscaled"] = write_mp4(out / f"game_x{factor}.mp4", upscale(np.concatenate(all_frames), factor),
                                             fps=renderer.fps)
    print(f"wrote {len(turns)} clips: {out}/turn_XXX/clip.mp4 (+ .gif)")
    print(f"game video:     {written['game']}" + (f" (x{factor}: {written['game_upscaled']})" if factor > 1 else ""))
    print(f"contact sheet:  {written['contact_sheet']}")
    return written


if __name__ == "__main__":
    main()
