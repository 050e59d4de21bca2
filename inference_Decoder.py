"""Render the clips of a game played by inference_MLLM.py: one mp4 + gif per turn, the whole game, a contact sheet.

    python inference_MLLM.py --config configs/spriteworld/inference.yaml     # CPU, the shipped SpriteWorld world
    python inference_Decoder.py --config configs/spriteworld/inference.yaml  # (the two = make demo)
    python inference_Decoder.py --config configs/inference.yaml              # full size, converted weights

Reads ``output_dir`` (the MLLM results: game.json, turns.jsonl, turn_XXX/shot_embeds.safetensors,
turn_XXX/state.json), renders each recorded turn with :meth:`animegamer.game.turn.AnimeGamer.render_turn` (the
render step of the game's one turn) and writes beside them::

    output_dir/turn_000.mp4, turn_000.gif      each turn's clip (decoder seed derived from the game seed and turn)
    output_dir/game.mp4                        all turns one after another (written as the turns are rendered:
                                               a long game is never in memory at once)
    output_dir/contact_sheet.png               a row per turn: frames, the whole instruction, values and state
                                               (64 turns a sheet; then contact_sheet_064.png, ... by first turn)
    output_dir/turn_000_x4.mp4, game_x4.mp4    the same enlarged by nearest neighbour (clips under 256 rows;
                                               the factor is in the name) for people to look at

``decoder_checkpoint`` is a stage (c) or (a) checkpoint; ``sampling.preset=fast`` (or ``fast=true``) uses the fast
sampling preset, and every other inference option applies (``device``, ``offload``, ``merge_lora``, ``compile``,
``fp8``, ``sampling.cache``).
The results are untrusted input: every turn directory must lie inside ``output_dir`` (symlinks followed), every
file must be what inference_MLLM.py writes, every shot must have the shape this config's models take
(``mllm.num_slots`` x ``mllm.shot_dim``, whatever game.json says) and every instruction must be one the game
accepts (at most 400 characters, printable). A missing checkpoint, a bad file, ``device=cuda`` without a GPU or an
``output_dir`` that cannot be written stops the run with one line, before the decoder loads. So does another
inference_MLLM.py or inference_Decoder.py running in ``output_dir`` (named by its PID and command). A disk that
fills while rendering stops the run with one line (exit 1): every file is complete or absent (the clips rendered
before it stay, the game video and the contact sheet being written are removed); run it again with space.
"""

from __future__ import annotations

import dataclasses
import sys
from contextlib import ExitStack
from pathlib import Path

from tqdm.auto import tqdm

from animegamer.cli import fail, hold_output_dir, no_bars_in_logs, parse_config
from animegamer.config import InferenceConfig
from animegamer.data.video import mp4_stream, write_mp4
from animegamer.game.build import check_checkpoints
from animegamer.game.contact_sheet import (
    contact_sheet,
    readable_factor,
    sample_frame_indices,
    upscale,
)
from animegamer.game.preflight import check_device, check_output_dir
from animegamer.game.results import load_results
from animegamer.game.turn import Turn, clip_stem
from animegamer.official.game import build_game, render_levels
from animegamer.states import CharacterState, StateValues, state_bar

SHEET_TURNS = 64  # turns per contact sheet
SHEET_FILE = "contact_sheet.png"  # the first; then contact_sheet_064.png, ... named by their first turn
SHEET_FRAMES = 6  # frames shown per turn

def sheet_label(state: dict) -> list[str]:
    """A turn's lines on the contact sheet: the instruction, the predicted values, the state bars after it."""
    v, s = state["values"], state["state"]
    return [
        f"turn {state['index']}: {state['instruction']}",
        f"level {v['motion_level']}  social {v['social']}  ent {v['entertainment']}  stamina {v['stamina']:+d}",
        state_bar("stamina", s["stamina"], 12),
        state_bar("social", s["social"], 12),
        state_bar("entertainment", s["entertainment"], 12),
    ]


def recorded_turn(state: dict, shot_embeds) -> Turn:
    """A turn of the MLLM results (``load_results`` checked it) as the game holds it."""
    return Turn(state["index"], state["instruction"], StateValues(**state["values"]),
                CharacterState.from_dict(state["state"]), shot_embeds, state["prompt_tokens"])


def main(argv: list[str] | None = None) -> dict[str, Path]:
    cfg, _ = parse_config(InferenceConfig, __doc__, argv)
    no_bars_in_logs()
    out = Path(cfg.output_dir)
    try:  # everything that can be wrong with the input, before any weights are read
        check_device(cfg.device)
        check_checkpoints(cfg, mllm=False)
        game, turns = load_results(out, shape=(cfg.mllm.num_slots, cfg.mllm.shot_dim))
        check_output_dir(out)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if not turns:
        fail(f"{out}/game.json lists no turns")
    with hold_output_dir(out, temp_depth=1):  # no inference_MLLM.py rewriting the results while we render them
        try:
            written = render(cfg, out, game, turns)
        except OSError as exc:  # a full disk: every file is written whole or not at all (animegamer.io)
            print(f"error: rendering stopped: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
    print(f"wrote {len(turns)} clips: {out}/turn_XXX.mp4 (+ .gif)")
    big = written.get("game_upscaled")
    print(f"game video:     {written['game']}" + (f" (enlarged: {big})" if big else ""))
    print(f"contact sheet:  {written['contact_sheet']}")
    return written


def render(cfg: InferenceConfig, out: Path, game: dict, turns: list) -> dict:
    """Render every turn, the game videos and the contact sheets, holding ``out``; returns what was written."""
    try:  # compat released: the level the release parsed, through its own table
        levels = render_levels(cfg, [state for state, _ in turns])
    except ValueError as exc:
        fail(f"{out}: {exc}")
    try:
        animegamer = build_game(cfg, mllm=False)  # the core's renderer, or the release's under compat: released
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    fps = animegamer.renderer.fps
    animegamer = dataclasses.replace(animegamer, seed=int(game.get("seed", cfg.seed)))  # the recorded game's seed
    factor = readable_factor(cfg.sampling.height)

    written = {"clips": clip_stem(out, 0).with_suffix(".mp4"), "game": out / "game.mp4",
               "contact_sheet": out / SHEET_FILE}
    if factor > 1:
        written["game_upscaled"] = out / f"game_x{factor}.mp4"
    rows = []  # the contact sheet rows not yet written: nothing here grows with the length of the game
    with ExitStack() as videos:  # the game videos are streamed, turn by turn, and published when all turns are in
        game_video = videos.enter_context(mp4_stream(written["game"], fps=fps))
        big_video = videos.enter_context(mp4_stream(written["game_upscaled"], fps)) if factor > 1 else None
        for (state, shot_embeds), level in tqdm(list(zip(turns, levels, strict=True)), desc="render turns",
                                                disable=None):  # (no bar in a log file)
            index = state["index"]
            frames = animegamer.render_turn(recorded_turn(state, shot_embeds), out, motion_level=level)
            game_video(frames)
            if big_video is not None:
                big = upscale(frames, factor)
                write_mp4(out / f"turn_{index:03d}_x{factor}.mp4", big, fps=fps)
                big_video(big)
            rows.append((frames[sample_frame_indices(len(frames), SHEET_FRAMES)], sheet_label(state)))
            if len(rows) == SHEET_TURNS or index == len(turns) - 1:  # a long game: several sheets, none huge
                first = index + 1 - len(rows)
                name = SHEET_FILE if first == 0 else f"contact_sheet_{first:03d}.png"
                contact_sheet(rows, out / name, frames_per_row=SHEET_FRAMES, scale=min(factor, 2))
                rows = []
    return written


if __name__ == "__main__":
    main()
