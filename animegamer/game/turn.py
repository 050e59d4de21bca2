"""One game turn, in one place: :class:`AnimeGamer` holds the MLLM and the decoder, :meth:`AnimeGamer.play_turn`
plays a turn.

    game = build_game(load_config("configs/spriteworld/inference.yaml"))     # animegamer.game.build
    turn = game.play_turn(history, "Character: Qiqi; Motion: run; Background: park.", out_dir="outputs/play")

``play_turn(history, instruction)`` reads top to bottom:

1. parse the instruction (a readable error before any model runs);
2. window the history: the last ``history_turns`` (K) turns, the only place the history is windowed, so the
   prompt, memory and time per turn stay flat however long the game runs;
3. the MLLM: one prefill gives the shot representation s_a (N, D) and the state values, and the character state
   follows from them;
4. sample the clip's latents from s_a and the motion level, with the turn's own seed (:func:`turn_seed`);
5. decode them chunk by chunk; the first frames are reported as soon as they exist;
6. write the clip: ``turn_000.gif`` and ``turn_000.mp4`` (:func:`write_turn_clip`: both or neither), at once, or,
   given a :class:`~animegamer.game.clip_writer.ClipWriter`, in its thread while the game goes on: the turn
   returns as soon as its frames are decoded, and ``turn.clip`` / ``turn.gif`` are set once both files exist
   (:meth:`Turn.wait_clip` waits for them).

Steps 4-6 are :meth:`AnimeGamer.render_turn`, which renders a turn predicted earlier (inference_Decoder.py) or
loaded from a save. What a turn needs from the models are two small protocols, :class:`StatePredictor` (the MLLM)
and :class:`ShotRenderer` (the decoder): the core's are :class:`animegamer.game.predictor.MLLMPredictor`
and :class:`animegamer.game.renderer.DecoderRenderer`; under ``compat: released``,
:mod:`animegamer.official.game` gives the same ones the release's own turn function and sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from animegamer.data.video import write_gif, write_mp4
from animegamer.game.clip_writer import ClipWriter, PendingWrite
from animegamer.game.save import check_shot
from animegamer.models.mllm_turn import HistoryTurn, TurnPrediction
from animegamer.states import MAX_INSTRUCTION_CHARS, CharacterState, StateValues, parse_instruction

# ---------------------------------------------------------------------------------------------------------------
# what a turn needs from the models


class StatePredictor(Protocol):
    """The MLLM side of a turn."""

    @property
    def shot_shape(self) -> tuple[int, int]:
        """(num_slots, shot_dim) of the shots it predicts and reads back as history."""
        ...

    def validate(self, instruction: str) -> None:
        """The model's own check of an instruction (token count, reserved tokens): a ValueError naming it."""
        ...

    def predict_turn(self, history: Sequence[HistoryTurn], instruction: str) -> TurnPrediction:
        """The next game state from ``history`` used exactly as given (:meth:`AnimeGamer.play_turn` windows it)."""
        ...


class ShotRenderer(Protocol):
    """The decoder side of a turn: s_a and a motion level -> latents -> frames."""

    fps: int

    def latents(self, shot_embeds: torch.Tensor, motion_level: int, seed: int,
                on_step: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """(N, H) s_a -> the clip's final latents (1, F, C, h, w), drawn from ``seed``; ``on_step(step, steps)``
        after every denoising step."""
        ...

    def chunk_count(self, latents: torch.Tensor) -> int:
        """How many chunks :meth:`decode` yields for ``latents``."""
        ...

    def decode(self, latents: torch.Tensor) -> Iterator[np.ndarray]:
        """(1, F, C, h, w) latents -> uint8 frames (t, H, W, 3), chunk by chunk, each as soon as it is decoded;
        the chunks put together are the whole clip."""
        ...

    def render_many(self, shots: Sequence[torch.Tensor], motion_levels: Sequence[int],
                    seeds: Sequence[int]) -> list[np.ndarray]:
        """Several clips in one batch (the evaluation), each as :meth:`latents` + :meth:`decode` draw it alone up
        to float rounding."""
        ...


@contextmanager
def on_device(module: torch.nn.Module, device: str, offload: bool):
    """Run a block with ``module`` on ``device``; with offload, move it back to the CPU afterwards."""
    if offload:
        module.to(device)
    try:
        yield module
    finally:
        if offload:
            module.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# a turn and its clip

# hears what a turn is doing now ("MLLM: ...", "denoising 3/20", "decoding", ...) and the fraction of it done
Progress = Callable[[str, float], None]


class TurnEvents:
    """What a turn tells its player while it runs; each method does nothing here, and a game's screen overrides
    what it shows (the terminal's status line, the browser's page). One object for the whole turn, handed from the
    session through :meth:`AnimeGamer.play_turn` to :meth:`AnimeGamer.render_turn`."""

    def stage(self, what: str, done: float) -> None:
        """What the turn is doing now ("MLLM: the next game state", "denoising 3/4", "decoding", "first 9 frames",
        "writing the clip") and the fraction of the turn done, 0..1."""

    # True: a clip's first frames go to the turn's gif at once, where the clip is written (the whole clip replaces
    # it), and :meth:`stage` names that file, for a screen that shows files (the terminal); False: they go to
    # :meth:`first_frames`
    early_gif: bool = False

    def first_frames(self, frames: np.ndarray) -> None:
        """A clip's first decoded frames (t, H, W, 3) uint8, while the rest decode (only for a clip that decodes
        in several chunks)."""

    def clip(self, frames: np.ndarray) -> None:
        """The whole clip's frames (T, H, W, 3) uint8, as soon as they are decoded, before its files are
        written."""


QUIET = TurnEvents()  # a turn nobody watches


def turn_seed(seed: int, index: int) -> int:
    """The decoder seed of turn ``index``: a game replays (or resumes) to the same clips."""
    return (seed * 1_000_003 + index) % (2**31)


def clip_stem(out_dir: str | Path, index: int) -> Path:
    """``out_dir/turn_000``: a turn's clip is ``turn_000.mp4`` + ``turn_000.gif`` (the one clip layout)."""
    return Path(out_dir) / f"turn_{index:03d}"


def write_clip(frames: np.ndarray | torch.Tensor, stem: str | Path, fps: float = 8) -> tuple[Path, Path]:
    """(T, H, W, 3) uint8 frames -> ``<stem>.gif`` then ``<stem>.mp4``, each written atomically; if the mp4 fails,
    the new gif is removed too, so an mp4 never stands without its gif. Returns (mp4, gif)."""
    frames = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    stem = Path(stem)
    gif = write_gif(stem.with_suffix(".gif"), frames, fps=fps)
    try:
        mp4 = write_mp4(stem.with_suffix(".mp4"), frames, fps=fps)
    except BaseException:
        gif.unlink(missing_ok=True)
        raise
    return mp4, gif


@dataclass
class Turn:
    index: int
    instruction: str
    values: StateValues
    state: CharacterState  # after this turn
    shot_embeds: torch.Tensor  # (N, H) float32, CPU
    prompt_tokens: int
    clip: str = ""  # mp4 path ("" when not rendered)
    gif: str = ""
    value_probs: dict[str, dict[int, float]] = field(default_factory=dict, repr=False)  # not saved
    release_values: list[int] | None = field(default=None, repr=False)  # compat released only; not saved
    # the clip being written in a ClipWriter's thread (None: written at once, or not rendered); not saved
    writing: PendingWrite | None = field(default=None, repr=False, compare=False)
    shown: str = field(default="", repr=False, compare=False)  # the clip as a page shows it (web.py); not saved

    def wait_clip(self, timeout: float | None = None) -> bool:
        """Wait until this turn's clip is written, if it is being written in the background; True when its files
        exist (``clip`` and ``gif`` are then set), False when the write failed (``writing.error`` says why; neither
        file exists), the turn has no clip, or ``timeout`` ran out."""
        if self.writing is not None:
            self.writing.wait(timeout)
        return bool(self.clip)

    def record(self) -> dict:
        """The turn as JSON, the one form every file holds (a save's ``turns``, inference_MLLM.py's
        ``state.json``): ``index``, ``instruction``, ``values`` (the predicted values), ``state`` (the character's
        bars after the turn), ``prompt_tokens``, ``clip`` and ``gif`` (the clip's files, or None)."""
        return {
            "index": self.index,
            "instruction": self.instruction,
            "values": vars(self.values),
            "state": self.state.to_dict(),
            "prompt_tokens": self.prompt_tokens,
            "clip": self.clip,
            "gif": self.gif,
        }


def remove_clip_files(stem: Path) -> None:
    """Remove ``<stem>.mp4`` and ``<stem>.gif`` if they are files (whatever else sits there is not a clip of ours)."""
    for suffix in (".mp4", ".gif"):
        path = stem.with_suffix(suffix)
        if not path.is_dir():
            path.unlink(missing_ok=True)


def write_turn_clip(turn: Turn, frames: np.ndarray, stem: Path, fps: float) -> tuple[Path, Path]:
    """Write ``turn``'s clip (:func:`write_clip`) and only then set ``turn.clip`` and ``turn.gif``, so that no
    reader ever sees a path to a missing or half-written file (a turn rendered again has no paths while it is
    written). If it fails, neither file is left at ``stem`` (an earlier render's or the first frames' gif
    included) and the error is raised. Run at once by :meth:`AnimeGamer.render_turn`, or in a
    :class:`ClipWriter`'s thread."""
    turn.clip = turn.gif = ""
    try:
        mp4, gif = write_clip(frames, stem, fps=fps)
    except BaseException:
        remove_clip_files(stem)
        raise
    turn.gif, turn.clip = str(gif), str(mp4)
    return mp4, gif


# ---------------------------------------------------------------------------------------------------------------
# the game's one turn


@dataclass
class AnimeGamer:
    """The MLLM (``predictor``) and the decoder (``renderer``) of a game; either may be None for a half turn
    (inference_MLLM.py predicts without rendering, inference_Decoder.py renders recorded predictions)."""

    predictor: StatePredictor | None
    renderer: ShotRenderer | None
    history_turns: int = 1  # K
    # the game's seed, its one place: turn i renders from turn_seed(seed, i) (a loaded game is a copy with its own)
    seed: int = 42
    max_instruction_chars: int = MAX_INSTRUCTION_CHARS

    def validate(self, instruction: str) -> str:
        """The instruction as the MLLM will read it, or a ValueError saying why it cannot be played (TagError:
        empty, too long, not text; InstructionError: too many tokens, reserved tokens)."""
        text = parse_instruction(instruction, max_chars=self.max_instruction_chars).render()
        if self.predictor is not None:
            self.predictor.validate(text)
        return text

    def window(self, history: Sequence[Turn | HistoryTurn]) -> list[HistoryTurn]:
        """What the MLLM reads of the game so far: its last ``history_turns`` turns."""
        recent = history[max(len(history) - self.history_turns, 0) :] if self.history_turns > 0 else []
        return [HistoryTurn(t.instruction, t.shot_embeds, t.values) for t in recent]

    def play_turn(self, history: Sequence[Turn], instruction: str, *, index: int | None = None,
                  out_dir: str | Path | None = None, render: bool = True, events: TurnEvents = QUIET,
                  writer: ClipWriter | None = None) -> Turn:
        """The next turn of a game whose turns so far are ``history``: parse, window, predict, then (with a renderer
        and ``render``) :meth:`render_turn`. ``index`` is the turn's number in the game (default ``len(history)``;
        given, ``history`` need only hold the last ``history_turns`` turns, at least one, as a long game keeps them).
        ``events`` hears the turn as it runs (:class:`TurnEvents`). With ``writer`` the turn returns before its clip
        is written (:meth:`render_turn`)."""
        if self.predictor is None:
            raise ValueError("this game has no MLLM: it can only render turns predicted before (render_turn)")
        # 1. parse: every check before any model runs
        text = self.validate(instruction)
        # 2. the history window: the MLLM reads the last K turns
        window = self.window(history)
        # 3. the MLLM: one prefill -> s_a and the state values -> the character's state after the turn
        events.stage("MLLM: the next game state", 0.0)
        prediction = self.predictor.predict_turn(window, text)
        # a save refuses a shot with NaN or infinite values, so the turn is refused first (ValueError)
        shot = check_shot(prediction.shot_embeds.detach().float().cpu(), "the predicted shot")
        before = history[-1].state if history else CharacterState()
        turn = Turn(
            index=len(history) if index is None else index,
            instruction=text,
            values=prediction.values,
            state=before.update(prediction.values),
            shot_embeds=shot,
            prompt_tokens=prediction.prompt_tokens,
            value_probs=prediction.value_probs,
            release_values=prediction.release_values,
        )
        # 4-6. sample, decode (streamed), write
        if render and self.renderer is not None:
            self.render_turn(turn, out_dir, events=events, writer=writer)
        return turn

    def render_turn(self, turn: Turn, out_dir: str | Path | None, *, motion_level: int | None = None,
                    events: TurnEvents = QUIET, writer: ClipWriter | None = None) -> np.ndarray:
        """Render ``turn``'s clip and write it to ``out_dir`` (:func:`write_turn_clip`; None: not written); returns
        the frames (T, H, W, 3) uint8. The clip depends on the game's seed and the turn index only, so a re-render
        gives the same clip. ``motion_level`` overrides the predicted one (the release renders the level as it
        parsed it). ``events`` hears the stages, the first decoded chunk of a clip that decodes in several (not
        shown by it: written to the turn's gif at once, which the whole clip replaces) and the whole clip as soon as
        it is decoded (:class:`TurnEvents`). A failed or interrupted render leaves no part of the turn's clip (no
        gif or mp4 at its stem).

        Without ``writer`` the clip is written before this returns (what scripts that need the files at once use).
        With one, the write is queued on it (``turn.writing``) and this returns as soon as the frames are decoded;
        ``turn.clip`` and ``turn.gif`` are set when both files exist (:meth:`Turn.wait_clip`), and a write that
        fails leaves neither file and the paths empty. Wait for a pending write of the same turn before rendering
        it again (:class:`~animegamer.game.session.GameSession` does)."""
        if self.renderer is None:
            raise ValueError("this game has no decoder: it cannot render clips")
        renderer = self.renderer
        stem = clip_stem(out_dir, turn.index) if out_dir is not None else None
        level = turn.values.motion_level if motion_level is None else motion_level
        steps = [0]  # the sampler's step count, as its steps report it (the decode counts as one more step)

        def on_step(step: int, total: int) -> None:
            steps[0] = total
            # the MLLM took the first tenth of the turn (a guess: it varies with model sizes)
            events.stage(f"denoising {step}/{total}", 0.1 + 0.85 * step / (total + 1))

        # 4. sample the latents (1, F, C, h, w) from the turn's own seed
        latents = renderer.latents(turn.shot_embeds, level, turn_seed(self.seed, turn.index),
                                   None if events is QUIET else on_step)
        # 5. decode chunk by chunk; the first frames go out as soon as they exist
        events.stage("decoding", 0.1 + 0.85 * (1 - 1 / (steps[0] + 1)))
        count, chunks = renderer.chunk_count(latents), []
        try:
            for chunk in renderer.decode(latents):  # (t, H, W, 3) uint8
                chunks.append(chunk)
                if len(chunks) == 1 and count > 1 and events.early_gif and stem is not None:
                    first_gif = write_gif(stem.with_suffix(".gif"), chunk, fps=renderer.fps)  # replaced below
                    events.stage(f"first {len(chunk)} frames: {first_gif}", 0.9)
                elif len(chunks) == 1 and count > 1:  # shown from memory: no file in their way
                    events.first_frames(chunk)
                    events.stage(f"first {len(chunk)} frames", 0.9)
            frames = np.concatenate(chunks)  # (T, H, W, 3)
            events.clip(frames)
            # 6. write the clip: gif and mp4, both or neither; at once, or queued on the writer (the last step: once
            # queued, the write is the writer's, and nothing here can fail any more)
            if stem is not None and writer is not None:
                turn.writing = writer.submit(write_turn_clip, turn, frames, stem, renderer.fps,
                                             label=f"turn {turn.index}")
            elif stem is not None:
                events.stage("writing the clip", 0.95)
                turn.writing = None
                write_turn_clip(turn, frames, stem, renderer.fps)
        except BaseException:
            if stem is not None:
                turn.clip = turn.gif = ""
                remove_clip_files(stem)
            raise
        return frames
