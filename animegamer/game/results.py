"""The results directory of inference_MLLM.py (the predictor it plays: animegamer/game/predictor.py).

Results directory written by ``inference_MLLM.py`` (:class:`ResultsWriter`), read by ``inference_Decoder.py``
(:func:`load_results`)::

    output_dir/game.json                       {"format": "animegamer-mllm-results-v3", "complete": bool,
                                                "game": path, "history_turns": K, "seed": int,
                                                "mllm": {pretrained, checkpoint, vocabulary, num_slots, shot_dim},
                                                "turns_file": "turns.jsonl", "num_turns": int (once complete)}
    output_dir/turns.jsonl                     one line per finished turn: its state.json plus "dir": "turn_000"
    output_dir/turn_000/shot_embeds.safetensors  key "shot_embeds": (num_slots, shot_dim) float32
    output_dir/turn_000/state.json             the turn as a save holds it (Turn.record): {"index": 0,
                                                "instruction": str,
                                                "values": {motion_level, social, entertainment, stamina},
                                                "state": {stamina, social, entertainment},  (after the turn)
                                                "prompt_tokens": int, "clip": null, "gif": null}, and
                                                "value_probs": {field: {value: probability}},
                                                "release_values": [ML, SC, ET, ST]}  (the release's own turn
                                                only: the values as it parsed them, 0s on a failed parse)

A turn costs the same to write whether it is the first or the ten-thousandth: its two files are written atomically,
then one line is appended to ``turns.jsonl`` and flushed to disk; ``game.json`` is written only at the start
(``complete`` false) and at the end (``complete`` true, ``num_turns``). So ``turns.jsonl`` always lists exactly
the turns whose files are complete (a line cut short by a crash is not a turn). Results of an earlier format are
refused in one line (run inference_MLLM.py again).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from animegamer.game.save import check_shot
from animegamer.game.turn import Turn
from animegamer.io import (
    MAX_RECORD_BYTES,
    atomic_write_json,
    check_regular_file,
    parse_json,
    path_inside,
    read_json_bounded,
    write_cause,
)
from animegamer.models.weights import load_state_dict_file, save_state_dict_file
from animegamer.states import CharacterState, StateValues, parse_instruction

RESULTS_FORMAT = "animegamer-mllm-results-v3"
SHOT_FILE = "shot_embeds.safetensors"
STATE_FILE = "state.json"
GAME_FILE = "game.json"
TURNS_FILE = "turns.jsonl"
_TURN_DIR = re.compile(r"^turn_\d{3,}$")
_TURN_CLIP = re.compile(r"^turn_\d{3,}(_x\d+)?\.(mp4|gif)$")  # a rendered turn (inference_Decoder.py)
MAX_TURNS_FILE_BYTES = 1 << 30  # turns.jsonl: a line is about 1 kB, so a million turns fit


def turn_dir(output_dir: str | Path, index: int) -> Path:
    return Path(output_dir) / f"turn_{index:03d}"


def clear_results(output_dir: str | Path) -> None:
    """Remove an earlier run's turn directories, their clips, game.json and turns.jsonl (only those), so no stale
    turn survives."""
    out = Path(output_dir)
    if not out.is_dir():
        return
    (out / GAME_FILE).unlink(missing_ok=True)  # first: a half-cleared folder is never read as results
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink() and _TURN_DIR.match(child.name):
            shutil.rmtree(child)
        elif child.is_symlink() and _TURN_DIR.match(child.name):
            child.unlink()
        elif _TURN_CLIP.match(child.name) and (child.is_file() or child.is_symlink()):
            child.unlink()  # a link itself, never its target
    (out / TURNS_FILE).unlink(missing_ok=True)


def turn_record(turn: Turn) -> dict[str, Any]:
    """A turn's state.json: :meth:`Turn.record` and what only the MLLM's results keep (its value probabilities and,
    under the release's own turn, the values as the release parsed them)."""
    return {
        **turn.record(),
        "value_probs": {k: {str(v): p for v, p in d.items()} for k, d in turn.value_probs.items()},
        **({"release_values": turn.release_values} if turn.release_values is not None else {}),
    }


def write_turn(output_dir: str | Path, turn: Turn) -> dict[str, Any]:
    """Write ``turn_XXX/shot_embeds.safetensors`` and ``turn_XXX/state.json``; returns the state record."""
    folder = turn_dir(output_dir, turn.index)
    record = turn_record(turn)
    save_state_dict_file({"shot_embeds": turn.shot_embeds.float()}, folder / SHOT_FILE)
    atomic_write_json(folder / STATE_FILE, record)
    return record


class ResultsWriteError(OSError):
    """A turn could not be written (a full disk, a file size limit); the turns before it are complete and listed."""


class ResultsWriter:
    """A results directory written turn by turn, at the same cost for every turn (format in the module docstring).
    A turn that cannot be written (:class:`ResultsWriteError`) leaves neither its files nor a part of its
    turns.jsonl line: the directory holds the turns before it, complete, as a run stopped there would.

        with ResultsWriter(output_dir, summary) as results:   # clears an earlier run, game.json: complete false
            for turn in turns:                                # animegamer.game.turn.Turn, in order
                results.add(turn)                             # turn files + one line appended to turns.jsonl
            results.finish()                                  # game.json: complete true, num_turns
    """

    def __init__(self, output_dir: str | Path, summary: dict[str, Any]):
        self.output_dir = Path(output_dir)
        self.summary = summary
        self.num_turns = 0
        clear_results(self.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # a raw descriptor: a line that fails half-written is cut off again by its offset (no buffer in between)
        self._turns = os.open(self.output_dir / TURNS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self._turns_size = 0
        self._write_header(complete=False)

    def _write_header(self, complete: bool) -> Path:
        path = self.output_dir / GAME_FILE
        header = {"format": RESULTS_FORMAT, "complete": complete, **self.summary, "turns_file": TURNS_FILE}
        atomic_write_json(path, {**header, "num_turns": self.num_turns} if complete else header)
        return path

    def add(self, turn: Turn) -> dict[str, Any]:
        """Write ``turn`` (the next one in order) and list it in turns.jsonl, durably; returns its state record."""
        if turn.index != self.num_turns:
            raise ValueError(f"turn {turn.index} written after {self.num_turns} turns")
        try:
            record = write_turn(self.output_dir, turn)
            line = (json.dumps({**record, "dir": turn_dir(".", turn.index).name}) + "\n").encode("utf-8")
            written = 0
            while written < len(line):
                written += os.write(self._turns, line[written:])
            os.fsync(self._turns)
        except (OSError, SafetensorError) as exc:
            os.ftruncate(self._turns, self._turns_size)
            shutil.rmtree(turn_dir(self.output_dir, turn.index), ignore_errors=True)
            raise ResultsWriteError(f"could not write turn {turn.index} to {self.output_dir}: {write_cause(exc)}; "
                                    f"the {self.num_turns} turns before it are complete") from None
        self._turns_size += len(line)
        self.num_turns += 1
        return record

    def finish(self) -> Path:
        """Mark the results complete; returns the path of game.json."""
        self.close()
        return self._write_header(complete=True)

    def close(self) -> None:
        if self._turns >= 0:
            os.close(self._turns)
            self._turns = -1

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load_results(
    output_dir: str | Path, shape: tuple[int, int] | None = None
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], torch.Tensor]]]:
    """(game.json with ``"turns"`` listing every turn, [(state.json, shot_embeds (N, shot_dim)) per turn]) of a
    results directory; an unfinished run gives the turns finished so far.

    The directory is untrusted input: turn ``i``'s ``dir`` must be ``turn_{i:03d}`` and its files must lie inside
    ``output_dir`` once symlinks are followed; records, instructions (:func:`animegamer.states.parse_instruction`:
    the game's own length limit) and shots are checked. ``shape`` is the (num_slots, shot_dim) the caller's models
    take (from its config, not from game.json): results of another shape are refused. ValueError naming the file
    otherwise."""
    out = Path(output_dir)
    game_file = out / GAME_FILE
    if not os.path.lexists(game_file):  # something there that is not a file: refused by name below
        raise FileNotFoundError(f"no MLLM results in {out} ({GAME_FILE} missing); run inference_MLLM.py first")
    game = _read_json(game_file)
    if game.get("format") != RESULTS_FORMAT:
        known = str(game.get("format", "")).startswith("animegamer-mllm-results-")
        raise ValueError(f"{game_file}: results format {game.get('format')!r}, not {RESULTS_FORMAT!r}"
                         + ("; written by an earlier version: run inference_MLLM.py again" if known else ""))
    mllm, seed = game.get("mllm"), game.get("seed")
    if not isinstance(mllm, dict) or type(seed) is not int:
        raise ValueError(f"{game_file}: 'mllm' must be a mapping and 'seed' an integer")
    recorded = (mllm.get("num_slots"), mllm.get("shot_dim"))
    if shape is not None and recorded != tuple(shape):
        raise ValueError(f"{game_file}: the results hold shots of num_slots={recorded[0]}, shot_dim={recorded[1]}; "
                         f"this config's models take num_slots={shape[0]}, shot_dim={shape[1]}")
    entries = _read_turn_lines(out, game, game_file)
    game["turns"] = entries
    turns = []
    for index, entry in enumerate(entries):
        place = f"{out / TURNS_FILE}: line {index + 1}"
        expected = turn_dir(".", index).name
        if not isinstance(entry, dict) or entry.get("dir") != expected:
            raise ValueError(f"{place}: 'dir' must be {expected!r}")
        state_file, shot_file = (path_inside(out, Path(expected) / name) for name in (STATE_FILE, SHOT_FILE))
        state = _read_json(state_file)
        try:
            if state.get("index") != index or not isinstance(state.get("instruction"), str):
                raise ValueError("'index' or 'instruction' is wrong")
            if type(state.get("prompt_tokens")) is not int:
                raise ValueError("'prompt_tokens' must be an integer")
            parse_instruction(state["instruction"], source="instruction")
            StateValues(**state["values"])
            CharacterState.from_dict(state["state"])
            shot = check_shot(load_state_dict_file(shot_file)["shot_embeds"], SHOT_FILE, shape or recorded)
        except (KeyError, TypeError, ValueError, SafetensorError) as exc:  # TagError and SaveError are ValueErrors
            raise ValueError(f"{state_file.parent}: not a turn written by inference_MLLM.py ({exc})") from None
        turns.append((state, shot))
    return game, turns


def _read_turn_lines(out: Path, game: dict[str, Any], game_file: Path) -> list[Any]:
    """The entries of turns.jsonl; a last line without its newline is a turn still being written (refused once
    the results claim to be complete)."""
    if game.get("turns_file") != TURNS_FILE or type(game.get("complete")) is not bool:
        raise ValueError(f"{game_file}: 'turns_file' must be {TURNS_FILE!r} and 'complete' true or false")
    path = path_inside(out, TURNS_FILE)
    entries = []
    try:
        check_regular_file(path, MAX_TURNS_FILE_BYTES)  # a named pipe would block, a device read without end
        with path.open(encoding="utf-8", newline="\n") as fh:
            for number, line in enumerate(iter(lambda: fh.readline(MAX_RECORD_BYTES + 1), ""), start=1):
                if len(line) > MAX_RECORD_BYTES:
                    raise ValueError(f"{path}: line {number} is longer than {MAX_RECORD_BYTES:,} characters")
                if not line.endswith("\n"):
                    if game["complete"]:
                        raise ValueError(f"{path}: line {number} is cut short")
                    break
                try:
                    entries.append(parse_json(line))
                except (json.JSONDecodeError, RecursionError) as exc:
                    raise ValueError(f"{path}: line {number} is not JSON ({exc})") from None
    except FileNotFoundError:
        raise ValueError(f"{game_file}: {TURNS_FILE} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not readable ({type(exc).__name__}: {exc})") from None
    if game["complete"] and game.get("num_turns") != len(entries):
        raise ValueError(f"{game_file}: 'num_turns' is {game.get('num_turns')!r} but {path.name} lists "
                         f"{len(entries)} turns")
    return entries


def _read_json(path: Path) -> dict[str, Any]:
    """A results record: bounded, never a pipe or a device (:func:`animegamer.io.read_json_bounded`)."""
    try:
        data = read_json_bounded(path)  # FileNotFoundError, or a ValueError naming the file
    except (FileNotFoundError, ValueError):
        raise
    except OSError as exc:
        raise ValueError(f"{path}: not readable JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
