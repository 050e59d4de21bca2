"""GameSession: one turn = MLLM prediction -> CharacterState update -> decoder render, with a sliding history.

    session = GameSession(predictor, renderer, history_turns=3, output_dir="outputs/play")
    turn = session.play("Character: Qiqi; Motion: gently lie down; Background: night bedroom.")
    session.save("outputs/play/qiqi.game")            # one atomic file: states, instructions, s_a
    session = GameSession.load("outputs/play/qiqi.game", predictor, renderer, history_turns=3)

Only the last ``history_turns`` turns are fed back to the MLLM, so the prompt, memory and time per turn stay
flat however long the game runs. Each turn's decoder seed is derived from (session seed, turn index), so a
loaded game continues exactly as the original would have. A save is untrusted input when loaded
(:mod:`animegamer.inference.saved`): every field is checked and its clip paths are never opened.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from safetensors.torch import save_file

from animegamer.data.video import write_gif, write_mp4
from animegamer.inference.mllm_runner import HistoryTurn, TurnPrediction
from animegamer.inference.saved import (
    MAX_HISTORY_TURNS,
    MAX_SEED,
    SAVE_FORMAT,
    check_shot,
    file_kind,
    is_save,
    read_save,
    turn_key,
)
from animegamer.io import atomic_path
from animegamer.states import MAX_INSTRUCTION_CHARS, CharacterState, StateValues, parse_instruction

SAVE_NAME = "game.save"  # a game's default save file, inside its own output directory


def turn_seed(seed: int, index: int) -> int:
    """The decoder seed of turn ``index``: a game replays (or resumes) to the same clips."""
    return (seed * 1_000_003 + index) % (2**31)


def check_game_settings(seed: int, history_turns: int) -> None:
    """A game's seed and history window K, in the ranges its save holds: ValueError naming the setting."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed={seed} must be an integer in 0..{MAX_SEED} (a save holds no other)")
    if isinstance(history_turns, bool) or not isinstance(history_turns, int) \
            or not 0 <= history_turns <= MAX_HISTORY_TURNS:
        raise ValueError(f"history_turns={history_turns} must be an integer in 0..{MAX_HISTORY_TURNS}")


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


class StatePredictor(Protocol):
    def predict_turn(self, history: list[HistoryTurn], instruction: str) -> TurnPrediction: ...


class ShotRenderer(Protocol):
    fps: int

    def render(self, shot_embeds: torch.Tensor, motion_level: int, seed: int) -> np.ndarray:
        """(N, H) shot representation -> (T, H, W, 3) uint8 frames. A renderer that reports its progress takes
        ``progress`` and ``on_frames`` keywords too (:class:`animegamer.inference.session.DecoderRenderer`: the
        clip's frames chunk by chunk as they are decoded); they are passed only when a game shows progress."""
        ...


# hears what a turn is doing now ("MLLM: ...", "denoising 3/20", "decoding", ...) and the fraction of it done
Progress = Callable[[str, float], None]
# gets a clip's first decoded frames (t, H, W, 3) uint8 and the gif they were written to, before the rest decode
Preview = Callable[[np.ndarray, Path], None]


@dataclass
class Turn:
    index: int
    instruction: str
    values: StateValues
    state: CharacterState  # after this turn
    shot_embeds: torch.Tensor  # (N, H) float32, CPU
    prompt_tokens: int
    clip: str = ""  # mp4 path ("" when rendering is off)
    gif: str = ""

    def summary(self) -> dict:
        return {
            "index": self.index,
            "instruction": self.instruction,
            "values": vars(self.values),
            "state": self.state.to_dict(),
            "prompt_tokens": self.prompt_tokens,
            "clip": self.clip,
            "gif": self.gif,
        }


@dataclass
class GameSession:
    predictor: StatePredictor
    renderer: ShotRenderer | None
    history_turns: int = 1
    output_dir: str | Path = "outputs/play"
    seed: int = 42
    max_instruction_chars: int = MAX_INSTRUCTION_CHARS
    turns: list[Turn] = field(default_factory=list)
    # the turns as last saved or loaded: the game has unsaved changes when they differ (same Turn objects or not)
    saved_turns: list[Turn] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        # what a game accepts its save must hold (animegamer.inference.saved), so it is refused here, not at :load
        check_game_settings(self.seed, self.history_turns)

    @property
    def unsaved(self) -> bool:
        """Turns played or undone since the last save or load."""
        return [id(t) for t in self.turns] != [id(t) for t in self.saved_turns]

    @property
    def state(self) -> CharacterState:
        return self.turns[-1].state if self.turns else CharacterState()

    def history(self) -> list[HistoryTurn]:
        """The sliding window the MLLM sees: the last ``history_turns`` turns."""
        window = self.turns[-self.history_turns :] if self.history_turns > 0 else []
        return [HistoryTurn(t.instruction, t.shot_embeds, t.values) for t in window]

    def play(self, instruction: str, progress: Progress | None = None, preview: Preview | None = None) -> Turn:
        """Validate the instruction (before any model runs), predict, update the state, render; ``progress`` hears
        each stage of the turn, ``preview`` the clip's first frames while the rest decode (:meth:`render_turn`)."""
        parsed = parse_instruction(instruction, max_chars=self.max_instruction_chars)
        text = parsed.render()
        if progress:
            progress("MLLM: the next game state", 0.0)
        prediction = self.predictor.predict_turn(self.history(), text)
        # a save refuses a shot with NaN or infinite values, so the turn is refused first (ValueError)
        check_shot(prediction.shot_embeds.detach().float().cpu(), "the predicted shot")
        index = len(self.turns)
        turn = Turn(
            index=index,
            instruction=text,
            values=prediction.values,
            state=self.state.update(prediction.values),
            shot_embeds=prediction.shot_embeds.detach().float().cpu(),
            prompt_tokens=prediction.prompt_tokens,
        )
        self.render_turn(turn, progress, preview)
        self.turns.append(turn)
        return turn

    def render_turn(self, turn: Turn, progress: Progress | None = None, preview: Preview | None = None) -> None:
        """Render ``turn``'s clip (mp4 + gif) into this session's output directory; no-op without a renderer.
        The seed depends on the game seed and the turn index only, so a re-render gives the same clip. With
        ``progress`` or ``preview``, the first decoded chunk of a clip that decodes in several goes to the turn's gif
        at once and to ``preview(frames (t, H, W, 3), gif path)``; the whole clip replaces the gif after."""
        if self.renderer is None:
            return
        shot = (turn.shot_embeds, turn.values.motion_level, turn_seed(self.seed, turn.index))
        stem = Path(self.output_dir) / f"turn_{turn.index:03d}"
        try:
            self._render(turn, shot, stem, progress, preview)
        except BaseException:  # a failed or interrupted render leaves no half of a turn's clip (mp4 without gif)
            turn.clip = turn.gif = ""
            for suffix in (".mp4", ".gif"):
                stem.with_suffix(suffix).unlink(missing_ok=True)
            raise

    def _render(self, turn: Turn, shot: tuple, stem: Path, progress: Progress | None,
                preview: Preview | None) -> None:

        def first_frames(frames, index: int, count: int) -> None:
            """The clip's first decoded chunk goes to its gif at once (replaced by the whole clip below)."""
            if index == 0 and count > 1:
                gif = write_gif(stem.with_suffix(".gif"), frames, fps=self.renderer.fps)
                if progress:
                    progress(f"first {len(frames)} frames: {gif}", 0.9)
                if preview:
                    preview(frames, gif)

        if progress or preview:  # the MLLM took the first tenth of the turn (a guess: it varies with model sizes)
            heard = (lambda stage, done: progress(stage, 0.1 + 0.85 * done)) if progress else None
            frames = self.renderer.render(*shot, progress=heard, on_frames=first_frames)
            if progress:
                progress("writing the clip", 0.95)
        else:
            frames = self.renderer.render(*shot)
        turn.clip = str(write_mp4(stem.with_suffix(".mp4"), frames, fps=self.renderer.fps))
        turn.gif = str(write_gif(stem.with_suffix(".gif"), frames, fps=self.renderer.fps))

    def undo(self) -> Turn:
        if not self.turns:
            raise IndexError("nothing to undo")
        return self.turns.pop()

    def save(self, path: str | Path) -> Path:
        """One atomic, fsynced safetensors file: the shots as tensors, everything else as JSON metadata
        (format in :mod:`animegamer.inference.saved`). It replaces only an earlier save (:func:`check_save_target`)
        and keeps that file's permissions."""
        mode = check_save_target(path)
        meta = {
            "format": SAVE_FORMAT,
            "seed": self.seed,
            "history_turns": self.history_turns,
            "turns": [t.summary() for t in self.turns],
        }
        tensors = {turn_key(t.index): t.shot_embeds for t in self.turns}
        if not tensors:  # safetensors needs at least one tensor
            tensors = {"empty": torch.zeros(0)}
        with atomic_path(path, mode=mode) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"game": json.dumps(meta)})
        self.saved_turns = list(self.turns)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, predictor: StatePredictor, renderer: ShotRenderer | None,
             output_dir: str | Path | None = None, *, history_turns: int,
             max_instruction_chars: int = MAX_INSTRUCTION_CHARS) -> GameSession:
        """A saved game, checked as untrusted input (:func:`animegamer.inference.saved.read_save`), continued by
        ``predictor`` with ``history_turns`` (K: a save played with another K is refused, so that the game goes on
        exactly as it would have). Clip paths in the save are dropped: :meth:`render_turn` makes a turn's clip
        again, inside ``output_dir``. Raises ValueError naming the file and field, or FileNotFoundError."""
        path = Path(path)
        if path.is_dir():
            inside = path / SAVE_NAME
            hint = f"; its saved game is {inside}" if inside.is_file() else ""
            raise ValueError(f"{path} is a directory, not a saved game file{hint}")
        saved = read_save(
            path,
            history_turns=history_turns,
            shot_shape=getattr(predictor, "shot_shape", None),
            validate_instruction=getattr(predictor, "validate", None),
            max_instruction_chars=max_instruction_chars,
        )
        session = cls(predictor, renderer, history_turns=history_turns, seed=saved.seed,
                      output_dir=output_dir if output_dir is not None else path.parent,
                      max_instruction_chars=max_instruction_chars)
        session.turns = [Turn(t.index, t.instruction, t.values, t.state, t.shot_embeds, t.prompt_tokens)
                         for t in saved.turns]
        session.saved_turns = list(session.turns)
        return session
