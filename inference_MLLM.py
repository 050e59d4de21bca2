"""Play a game file with the MLLM: per turn the predicted shot representation, state values and character state.

    python inference_MLLM.py --config configs/spriteworld/inference.yaml   # CPU, the shipped SpriteWorld world
    python inference_Decoder.py --config configs/spriteworld/inference.yaml  # then render its clips (= make demo)
    python inference_MLLM.py --config configs/inference.yaml game=game_demo/demo.txt   # full size, converted weights

The game file holds one instruction per line (``Character: …; Motion: …; Background: ….`` or free text; blank lines
and ``#`` comments skipped). Every instruction is checked before any model is loaded: an empty, over-long (more
than ``mllm.max_instruction_tokens`` tokens) or undecodable one stops the run with one line naming it.

Each turn is :meth:`animegamer.game.turn.AnimeGamer.play_turn` without rendering: the MLLM sees the last
``history_turns`` (K) turns, its own predictions fed back, so the prompt (and what is kept in memory) stays bounded.
Every inference option of the config applies (``device``, ``offload``, ``merge_lora``, ``seed``).
``mllm_checkpoint`` is a stage (b) checkpoint (a step dir, a run dir or ``…/checkpoints/latest``); an empty string
(``"mllm_checkpoint=''"`` on the command line) runs the base model with freshly initialised (seeded) LoRA, query
embeddings and resamplers, with a warning.

Also checked first: ``game`` is a text file (a directory or a pipe is refused without being opened; a UTF-8
byte-order mark at its start is dropped), ``device`` (``cuda`` without a GPU is refused) and that ``output_dir``
can be written. One run per ``output_dir``: while one runs, another inference_MLLM.py or inference_Decoder.py
there is refused with one line naming its PID and command (a lock of a killed run is taken over, and its temp
files are removed). A turn that cannot be written (a full disk) stops the run with one line, exit code 1: the
turns before it stay written and listed, and no part of that turn is left.

Results (format in animegamer/game/results.py, read by inference_Decoder.py); each turn costs the same to
write, however long the game::

    output_dir/game.json                          the settings; "complete": true once every turn is written
    output_dir/turns.jsonl                        one line per finished turn
    output_dir/turn_000/shot_embeds.safetensors   (num_slots, shot_dim) float32 under key "shot_embeds"
    output_dir/turn_000/state.json                index, instruction, values, state, prompt_tokens
"""

from __future__ import annotations

import sys
from collections import deque

from tqdm.auto import tqdm

from animegamer.cli import fail, hold_output_dir, no_bars_in_logs, parse_config
from animegamer.config import InferenceConfig
from animegamer.game.build import check_checkpoints
from animegamer.game.predictor import InstructionError, validate_instruction
from animegamer.game.preflight import check_device, check_output_dir
from animegamer.game.results import ResultsWriteError, ResultsWriter
from animegamer.io import resolve_checkpoint, write_cause
from animegamer.models.mllm_tokenizer import load_tokenizer
from animegamer.official.game import build_game
from animegamer.states import TagError, read_game_file


def main(argv: list[str] | None = None) -> None:
    cfg, _ = parse_config(InferenceConfig, __doc__, argv)
    no_bars_in_logs()
    # 1. everything that can be wrong with the input, before any weights are read
    try:
        instructions = [i.render() for i in read_game_file(cfg.game)]
    except FileNotFoundError:
        fail(f"game file not found: {cfg.game}")
    except UnicodeDecodeError as exc:
        fail(f"{cfg.game}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    except TagError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{cfg.game}: cannot read the game file ({exc.strerror or type(exc).__name__})")
    try:
        check_device(cfg.device)
    except ValueError as exc:
        fail(str(exc))
    try:
        check_checkpoints(cfg, decoder=False, base_only=True)  # missing weights: one line saying what to do
        tokenizer, base_vocab = load_tokenizer(cfg.mllm.pretrained, cfg.mllm.vocabulary, cfg.mllm.num_slots)
    except FileNotFoundError as exc:
        fail(str(exc))
    try:
        for index, text in enumerate(instructions):
            validate_instruction(
                text, tokenizer, base_vocab, cfg.mllm.max_instruction_tokens, where=f"{cfg.game}: turn {index + 1}"
            )
    except InstructionError as exc:
        fail(str(exc))
    try:
        check_checkpoints(cfg, decoder=False)
    except FileNotFoundError as exc:
        fail(str(exc))
    try:
        check_output_dir(cfg.output_dir)
    except ValueError as exc:
        fail(str(exc))
    checkpoint = resolve_checkpoint(cfg.mllm_checkpoint) if cfg.mllm_checkpoint else None  # checked just above
    with hold_output_dir(cfg.output_dir, temp_depth=1):  # one run per folder: a second would delete our turns
        play(cfg, instructions, checkpoint)


def play(cfg: InferenceConfig, instructions: list[str], checkpoint) -> None:
    """Steps 2-3, holding ``output_dir``: build the game (MLLM only) and write each turn as soon as it exists."""
    # 2. the game, MLLM only (every inference option of cfg honoured: device, offload, merge_lora, seed, K;
    # compat released: the release's own turn)
    try:
        game = build_game(cfg, render=False)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))

    # 3. play, writing each turn as soon as it exists
    summary = {
        "game": cfg.game,
        "history_turns": cfg.history_turns,
        "seed": cfg.seed,
        "mllm": {
            "pretrained": cfg.mllm.pretrained,
            "checkpoint": str(checkpoint) if checkpoint is not None else "",
            "vocabulary": cfg.mllm.vocabulary,
            "num_slots": cfg.mllm.num_slots,
            "shot_dim": cfg.mllm.shot_dim,
        },
    }
    recent = deque(maxlen=max(cfg.history_turns, 1))  # what the next turn reads: the last K turns and the state
    try:
        results = ResultsWriter(cfg.output_dir, summary)
    except OSError as exc:  # a full disk before the first turn
        print(f"error: could not start the results in {cfg.output_dir}: {write_cause(exc)}", file=sys.stderr)
        sys.exit(1)
    with results:
        for index, text in enumerate(tqdm(instructions, desc="turns", disable=None)):
            turn = game.play_turn(list(recent), text, index=index)
            recent.append(turn)
            try:
                results.add(turn)
            except ResultsWriteError as exc:  # a full disk: the turns before it stay complete and listed
                print(f"error: {exc}", file=sys.stderr)
                sys.exit(1)
            v, s = turn.values, turn.state
            tqdm.write(
                f"turn {turn.index:3d}  level {v.motion_level}  social {v.social}  ent {v.entertainment}  "
                f"stamina {v.stamina:+d}  |  stamina {s.stamina:3d} social {s.social:3d} ent {s.entertainment:3d}  "
                f"({turn.prompt_tokens} prompt tokens)"
            )
        try:
            path = results.finish()
        except OSError as exc:
            print(f"error: could not mark {cfg.output_dir} complete: {write_cause(exc)}; its {results.num_turns} "
                  "turns are written and listed", file=sys.stderr)
            sys.exit(1)
    print(f"wrote {results.num_turns} turns to {cfg.output_dir} ({path.name})")


if __name__ == "__main__":
    main()
