"""Reading a saved game (``GameSession.save``) as untrusted input.

A save may come from another player, a browser upload or a hand edit, so nothing in it is believed until checked:
exactly the expected keys with the expected types, one float32 shot of the model's shape per turn with finite
values, turn indices 0..n-1, state values in range and character states that follow from them by the game's rule,
instructions that pass the same checks as a live instruction (characters, tokens, reserved tokens), and the
history window K the running game uses. Any violation raises one :class:`SaveError` naming the file and the field.

Clip paths recorded in a save are never used: a loaded game renders its clips again into its own output directory
(a path read from a file could name any file on the machine, which the browser game would then serve).

Format ``animegamer-game-v1``: a safetensors file whose metadata ``"game"`` holds JSON
``{"format", "seed", "history_turns", "turns": [{"index", "instruction", "values", "state", "prompt_tokens",
"clip", "gif"}]}`` and whose tensors are ``turn_00000``… ``(num_slots, shot_dim)`` float32 (``empty`` when no turn).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from animegamer.io import atomic_path, write_cause
from animegamer.states import (
    MAX_INSTRUCTION_CHARS,
    STATE_MAX,
    STATE_MIN,
    CharacterState,
    StateValues,
    TagError,
    parse_instruction,
)

SAVE_FORMAT = "animegamer-game-v1"
SAVE_KEYS = frozenset({"format", "seed", "history_turns", "turns"})
TURN_KEYS = frozenset({"index", "instruction", "values", "state", "prompt_tokens", "clip", "gif"})
MAX_PROMPT_TOKENS = 10**7  # far above any real prompt; only a forged count reaches it
MAX_SEED = 2**63 - 1  # seeds 0..MAX_SEED: what a save holds, and so what a game may start with
MAX_HISTORY_TURNS = 10**6
MAX_INT_DIGITS = 40  # an integer in a save's JSON with more digits is refused by name, never converted
# the most turns a game holds: playing past it is refused, and a save declaring more is refused before any tensor is
# read (a SpriteWorld save is ~25 KB a turn, ~250 MB at the limit; a full-size one 1.7 MB a turn, 226 x 1920 float32)
MAX_TURNS = 10_000


class SaveError(ValueError):
    """A saved game that cannot be loaded; the message names the file and the field."""


@dataclass
class SavedTurn:
    index: int
    instruction: str
    values: StateValues
    state: CharacterState  # after this turn
    shot_embeds: torch.Tensor  # (N, H) float32, finite
    prompt_tokens: int


@dataclass
class SavedGame:
    seed: int
    history_turns: int
    turns: list[SavedTurn]


def turn_key(index: int) -> str:
    return f"turn_{index:05d}"


class LongNumber:
    """An integer in a save's JSON too long to be any field's value, kept as its digit count: Python refuses to
    convert one past 4300 digits, and a message quoting it would be as long."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(digits: str) -> int | LongNumber:
    return int(digits) if len(digits.lstrip("-")) <= MAX_INT_DIGITS else LongNumber(digits)


def _type(value: Any) -> str:
    return "int" if isinstance(value, LongNumber) else type(value).__name__


def _int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, LongNumber):
        raise SaveError(f"{field}: an integer of {value.digits} digits is outside {low}..{high}")
    if not isinstance(value, int) or isinstance(value, bool):
        raise SaveError(f"{field}: expected an integer, got {_type(value)}")
    if not low <= value <= high:
        raise SaveError(f"{field}: {value} is outside {low}..{high}")
    return value


def _dict(value: Any, field: str, keys: frozenset[str]) -> dict:
    if not isinstance(value, dict):
        raise SaveError(f"{field}: expected a mapping, got {_type(value)}")
    missing, extra = sorted(keys - value.keys()), sorted(value.keys() - keys)
    if missing or extra:
        raise SaveError(f"{field}: " + "; ".join(
            ([f"missing key(s) {missing}"] if missing else []) + ([f"unknown key(s) {extra}"] if extra else [])))
    return value


def check_shot(tensor: torch.Tensor, field: str, shape: tuple[int, int] | None = None) -> torch.Tensor:
    """A shot representation from a file: float32, 2-D (of ``shape`` if given), every value finite."""
    if tensor.dtype != torch.float32:
        raise SaveError(f"{field}: dtype {tensor.dtype}, expected torch.float32")
    if tensor.ndim != 2 or (shape is not None and tuple(tensor.shape) != tuple(shape)):
        expected = tuple(shape) if shape is not None else "(num_slots, shot_dim)"
        raise SaveError(f"{field}: shape {tuple(tensor.shape)}, expected {expected}")
    if not torch.isfinite(tensor).all():
        raise SaveError(f"{field}: holds NaN or infinite values")
    return tensor


def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def _instruction(value: Any, field: str, max_chars: int, validate: Callable[[str], None] | None) -> str:
    if not isinstance(value, str):
        raise SaveError(f"{field}: expected a string, got {_type(value)}")
    try:
        text = parse_instruction(value, max_chars=max_chars).render()
        if validate is not None:
            validate(text)
    except ValueError as exc:  # TagError, InstructionError
        raise SaveError(f"{field}: {exc}") from None
    if text != value:
        raise SaveError(f"{field}: not in the form the game saves ({value[:60]!r})")
    return text


def _metadata(fh) -> Any:
    """The parsed ``game`` metadata JSON of an open save."""
    raw = (fh.metadata() or {}).get("game")
    if raw is None:
        raise SaveError("not an animegamer saved game (no 'game' metadata)")
    try:
        return json.loads(raw, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise SaveError(f"metadata 'game' is not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise SaveError("metadata 'game' is nested too deeply") from None


def _check_top(meta: Any, history_turns: int) -> dict:
    """The save's top-level fields: format, seed, K and a list of turns."""
    meta = _dict(meta, "game", SAVE_KEYS)
    if meta["format"] != SAVE_FORMAT:
        raise SaveError(f"format: {str(meta['format'])[:60]!r} is not {SAVE_FORMAT!r}")
    _int(meta["seed"], "seed", 0, MAX_SEED)
    saved_k = _int(meta["history_turns"], "history_turns", 0, MAX_HISTORY_TURNS)
    if saved_k != history_turns:
        raise SaveError(f"history_turns: the game was played with K={saved_k} earlier turns in the MLLM's window, "
                        f"this game runs K={history_turns} (start it with history_turns={saved_k} to continue it)")
    if not isinstance(meta["turns"], list):
        raise SaveError(f"turns: expected a list, got {_type(meta['turns'])}")
    if len(meta["turns"]) > MAX_TURNS:
        raise SaveError(f"turns: {len(meta['turns']):,} turns, more than the {MAX_TURNS:,} a game holds (MAX_TURNS)")
    return meta


def _check_header(header: dict[str, tuple[str, tuple[int, ...]]], num_turns: int, shot_shape) -> None:
    """Tensor keys, dtypes and shapes as the safetensors header declares them ({key: (dtype, shape)}): one F32
    shot per turn, all of one shape (``shot_shape`` if given). Checked before any tensor data is read, so a save
    declaring extra or oversized tensors costs nothing to refuse."""
    expected_keys = {turn_key(i) for i in range(num_turns)} or {"empty"}
    if header.keys() != expected_keys:
        raise SaveError(f"tensors: {sorted(header)[:4]} do not match the {num_turns} turns "
                        f"(expected {sorted(expected_keys)[:4]})")
    shots = {key: shape for key, (dtype, shape) in header.items() if key != "empty"}
    for key in sorted(shots):
        dtype, shape = header[key]
        if dtype != "F32" or len(shape) != 2:
            raise SaveError(f"tensor {key}: dtype {dtype} shape {shape}, expected F32 (num_slots, shot_dim)")
        if shot_shape is not None and shape != tuple(shot_shape):
            raise SaveError(f"tensor {key}: shape {shape}, expected {tuple(shot_shape)}")
    if len(set(shots.values())) > 1:
        raise SaveError(f"tensors: turns have different shapes {sorted(set(shots.values()))}")


def _header(fh) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{key: (dtype, shape)} of an open safetensors file, from its header alone."""
    header = {}
    for key in fh.keys():
        view = fh.get_slice(key)
        header[key] = (view.get_dtype(), tuple(view.get_shape()))
    return header


def _read_file(path: Path, history_turns: int, shot_shape) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the checked top of the metadata, the turns' shots by key).

    The metadata and the tensor keys, count, dtypes and shapes are checked from the header first, through a
    read-only numpy handle that maps the file without committing memory for it. safetensors' torch handle maps
    the whole file copy-on-write as it opens, so a save declaring huge or extra tensors must be refused before
    one is opened. Only then are the shots read (and checked finite); the ``empty`` placeholder of a save with no
    turn is never read. The header is checked again in the torch handle, in case the file changed in between.
    """
    kind = file_kind(path)
    if kind == "missing":
        raise FileNotFoundError(f"saved game not found: {path}")
    if kind != "file":
        raise SaveError(f"{kind}, not a saved game file")
    try:
        with safe_open(str(path), framework="numpy") as fh:
            meta = _check_top(_metadata(fh), history_turns)
            _check_header(_header(fh), len(meta["turns"]), shot_shape)
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            header = _header(fh)
            _check_header(header, len(meta["turns"]), shot_shape)
            shots = {key: fh.get_tensor(key) for key in sorted(header) if key != "empty"}
    except (OSError, SafetensorError) as exc:
        raise SaveError(f"not an animegamer saved game ({exc})") from None
    for key, shot in shots.items():
        check_shot(shot, f"tensor {key}", shot_shape)
    return meta, shots


def file_kind(path: str | Path, follow: bool = True) -> str:
    """What is at ``path``: "missing", "file" (a regular file) or a phrase naming anything else ("a character
    device", "a symbolic link to a missing file", ...); ``follow=False`` names a symlink itself."""
    try:
        mode = os.stat(path).st_mode if follow else os.lstat(path).st_mode
    except FileNotFoundError:
        return "a symbolic link to a missing file" if os.path.islink(path) else "missing"
    except OSError as exc:  # a symlink loop, a path through a file
        return f"unreadable ({exc.strerror})"
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def is_save(path: str | Path) -> bool:
    """Whether ``path`` is a regular file whose content is an animegamer saved game (its header names the format),
    whatever its name; only the safetensors header is read."""
    if file_kind(path, follow=False) != "file":
        return False
    try:
        with safe_open(str(path), framework="numpy") as fh:
            meta = json.loads((fh.metadata() or {}).get("game", "null"), parse_int=_parse_int)
    except (OSError, SafetensorError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return False
    return isinstance(meta, dict) and meta.get("format") == SAVE_FORMAT


def read_save(
    path: str | Path,
    *,
    history_turns: int,
    shot_shape: tuple[int, int] | None = None,
    validate_instruction: Callable[[str], None] | None = None,
    max_instruction_chars: int = MAX_INSTRUCTION_CHARS,
) -> SavedGame:
    """Read and check a saved game for a session that runs ``history_turns`` (K) with shots of ``shot_shape``.

    ``validate_instruction`` is the predictor's live check (token count, reserved tokens); every history
    instruction must pass it, since the MLLM reads them all again. Raises :class:`SaveError` (a ValueError)
    naming ``path`` and the field, or FileNotFoundError.
    """
    path = Path(path)
    try:
        return _read_save(path, history_turns, shot_shape, validate_instruction, max_instruction_chars)
    except SaveError as exc:
        raise SaveError(f"{path}: {exc}") from None


def _read_save(path: Path, history_turns: int, shot_shape, validate, max_chars: int) -> SavedGame:
    meta, shots = _read_file(path, history_turns, shot_shape)
    turns, state = [], CharacterState()
    for position, raw in enumerate(meta["turns"]):
        field = f"turns[{position}]"
        raw = _dict(raw, field, TURN_KEYS)
        _int(raw["index"], f"{field}.index", position, position)
        instruction = _instruction(raw["instruction"], f"{field}.instruction", max_chars, validate)
        try:
            values = StateValues(**_dict(raw["values"], f"{field}.values", _names(StateValues)))
        except TagError as exc:
            raise SaveError(f"{field}.values: {exc}") from None
        state = state.update(values)
        recorded = _dict(raw["state"], f"{field}.state", _names(CharacterState))
        for name, value in recorded.items():
            _int(value, f"{field}.state.{name}", STATE_MIN, STATE_MAX)
        if recorded != state.to_dict():
            raise SaveError(f"{field}.state: {recorded} does not follow from the values played ({state.to_dict()})")
        prompt_tokens = _int(raw["prompt_tokens"], f"{field}.prompt_tokens", 0, MAX_PROMPT_TOKENS)
        for name in ("clip", "gif"):  # recorded for the player's information; never opened (see module doc)
            if not isinstance(raw[name], str):
                raise SaveError(f"{field}.{name}: expected a string, got {_type(raw[name])}")
        turns.append(SavedTurn(position, instruction, values, state, shots[turn_key(position)], prompt_tokens))
    return SavedGame(meta["seed"], meta["history_turns"], turns)


# ---------------------------------------------------------------------- writing


class SaveWriteError(OSError):
    """A save could not be written (a full disk, a file size limit, a folder gone); the message names the file and
    the cause, and the game's turns are as they were, in memory."""


def check_save_target(path: str | Path) -> int | None:
    """Whether a game may be saved to ``path``: a new file, or an earlier animegamer save (recognised by its
    content, not its name) with no other hard link. Anything else (a text file, a directory, a device, a pipe, a
    symbolic link, a hard-linked file) is refused with ValueError naming it, and left untouched. Returns the mode
    to give the new file: the replaced save's, so that saving never widens who may read it; None for a new one."""
    kind = file_kind(path, follow=False)
    if kind == "missing":
        return None
    if kind != "file":
        raise ValueError(f"{path} is {kind}, not a saved game: not replaced (save to another file)")
    info = os.lstat(path)
    if info.st_nlink > 1:
        raise ValueError(f"{path} has {info.st_nlink} hard links: not replaced, saving would break them "
                         "(save to another file)")
    if not is_save(path):
        raise ValueError(f"{path} exists and is not an animegamer saved game: not replaced (save to another file)")
    return info.st_mode & 0o777


def write_save(path: str | Path, seed: int, history_turns: int, turns: Sequence[Any], mode: int | None = None) -> Path:
    """One atomic, fsynced safetensors file of a game: the turns' shots (``turn_000``, ...) as tensors, the rest as
    JSON metadata (the format read by :func:`read_save`). ``turns``: the game's :class:`animegamer.game.turn.Turn`
    objects; ``mode``: the new file's permissions (:func:`check_save_target`'s). A write that fails raises
    :class:`SaveWriteError` and leaves any earlier file at ``path`` as it was."""
    meta = {"format": SAVE_FORMAT, "seed": seed, "history_turns": history_turns, "turns": [t.record() for t in turns]}
    tensors = {turn_key(t.index): t.shot_embeds for t in turns}
    if not tensors:  # safetensors needs at least one tensor
        tensors = {"empty": torch.zeros(0)}
    try:
        with atomic_path(path, mode=mode) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"game": json.dumps(meta)})
    except (OSError, SafetensorError) as exc:  # safetensors' own error on a full disk is no OSError
        raise SaveWriteError(f"could not save the game to {path}: {write_cause(exc)}; its {len(turns)} turns are "
                             "kept (save to another place)") from None
    return Path(path)
