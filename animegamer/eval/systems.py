"""The systems an evaluation compares, behind one small interface: play a game, return each turn's output.

    system = build_system("gc_baseline", eval_cfg, training_clips)
    outputs = system.play_game(game, out_dir)    # list[TurnOutput], one per instruction of the game

- ``animegamer`` (:class:`AnimeGamerSystem`): the full game, :meth:`AnimeGamer.play_turn` turn after turn (the
  MLLM with its K-turn history of predicted shot representations) and the decoder of ``inference`` (stage c by
  default).
- ``gc_baseline`` (:class:`GCBaseline`): the paper's GC-style baseline, the decoder driven by the text instruction
  alone, with no MLLM and no history. Its shot representation comes from the stage (a) encoder with the T5 tokens of
  the turn's instruction and the CLIP tokens of one fixed reference frame (``gc_reference``: a mid-grey frame by
  default, or a given image, or ``<dir>/<character>.png``); its motion level is fixed, by default the most common
  level of the training clips. It predicts no character state, so its state metrics are reported missing.
- ``reconstruction`` (:class:`ReconstructionSystem`): stage (a) alone, an upper bound and the yardstick of the
  encoder ablations: each turn's ground-truth clip is encoded (first frame + its motion text) and decoded with the
  ground-truth level. Needs games with ground-truth clips.
- ``random`` (:class:`RandomSystem`) and ``majority`` (:class:`MajorityClassSystem`): chance and majority-class
  predictions of the motion level and state values, without clips: the floor for ACC-S / MAE-S.

The rendering systems plan a game first (the per-turn model work, each turn possibly reading the one before: the
MLLM's prediction, the shot encoding), then render the planned clips ``render_batch`` at a time across the games of
one :meth:`play_games` call (:meth:`~animegamer.game.renderer.DecoderRenderer.render_many`: every clip from its
own seed, so a batch changes float rounding only; on a CPU, batches of 8 render about twice as fast). Clips are
written as the game writes them (:func:`animegamer.game.turn.write_clip`: ``turn_000.mp4`` + ``.gif``).

Time per turn counts the model work only (MLLM prediction, shot encoding, decoder sampling and VAE decoding), not
writing the clip files; a batch's rendering time is shared evenly by its clips.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from animegamer.config import EvalConfig, InferenceConfig
from animegamer.config.recorded import with_decoder_checkpoint
from animegamer.data.characters import load_image
from animegamer.data.features import fit_frames
from animegamer.data.manifest import ClipRecord
from animegamer.eval.benchmark import BenchmarkGame
from animegamer.eval.games import GroundTruthGame
from animegamer.game.build import build_game, resolve_device
from animegamer.game.turn import AnimeGamer, Turn, clip_stem, turn_seed, write_clip
from animegamer.models.clip_image import CLIPImageFeatures
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.t5_text import T5TextFeatures
from animegamer.models.trained import load_encoder
from animegamer.states import VALUE_RANGES, StateValues

RENDERING = ("animegamer", "gc_baseline", "reconstruction", "ground_truth")  # systems that produce clips
SYSTEMS = (*RENDERING, "random", "majority")


@dataclass
class TurnOutput:
    """What a system produced for one turn."""

    instruction: str
    values: StateValues | None  # predicted motion level and state deltas; None = the system predicts no state
    frames: np.ndarray | None  # (T, H, W, 3) uint8 clip; None = the system renders no clip
    motion_level: int | None  # the level the clip was rendered with (or predicted), None if neither
    seconds: float  # model time of this turn
    clip: str = ""  # the clip's mp4, when written


class System(Protocol):
    name: str

    def play_game(self, game: BenchmarkGame, out_dir: str | Path | None) -> list[TurnOutput]:
        """Play every instruction of ``game`` in order; clips (if any) go under ``out_dir`` (None: not written)."""
        ...

    def play_games(self, games: Sequence[BenchmarkGame], out_dirs: Sequence[str | Path | None],
                   render_batch: int = 1) -> list[list[TurnOutput]]:
        """:meth:`play_game` of each game; the rendering systems render their clips ``render_batch`` at a time."""
        ...


@dataclass
class PlannedClip:
    """What the renderer needs for one turn's clip, planned before any clip is drawn."""

    shot: torch.Tensor  # (N, H) s_a
    motion_level: int
    seed: int


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


class _Stopwatch:
    """Model seconds of the current turn (or batch of clips), accumulated by the timed calls."""

    def __init__(self, device: str):
        self.device, self.seconds = device, 0.0

    def timed(self, fn, *args):
        _sync(self.device)
        start = time.perf_counter()
        out = fn(*args)
        _sync(self.device)
        self.seconds += time.perf_counter() - start
        return out


class _TurnByTurn:
    """Systems without a renderer: games are played one after another."""

    def play_games(self, games: Sequence[BenchmarkGame], out_dirs: Sequence[str | Path | None],
                   render_batch: int = 1) -> list[list[TurnOutput]]:
        return [self.play_game(game, out_dir) for game, out_dir in zip(games, out_dirs, strict=True)]


class _Rendering:
    """Systems with a renderer: :meth:`plan_game` does a game's per-turn model work and returns each turn's output
    (without frames) and clip plan; :meth:`play_games` then renders the plans of all its games in batches."""

    renderer: object  # animegamer.game.renderer.DecoderRenderer
    device: str

    def plan_game(self, game: BenchmarkGame) -> list[tuple[TurnOutput, PlannedClip]]:
        raise NotImplementedError

    def play_game(self, game: BenchmarkGame, out_dir: str | Path | None) -> list[TurnOutput]:
        return self.play_games([game], [out_dir])[0]

    def play_games(self, games: Sequence[BenchmarkGame], out_dirs: Sequence[str | Path | None],
                   render_batch: int = 1) -> list[list[TurnOutput]]:
        planned = [self.plan_game(game) for game in games]
        pending = [turn for game_plan in planned for turn in game_plan]
        watch = _Stopwatch(self.device)
        for start in range(0, len(pending), render_batch):
            batch = pending[start : start + render_batch]
            watch.seconds = 0.0
            clips = [clip for _, clip in batch]
            frames = watch.timed(self.renderer.render_many, [c.shot for c in clips], [c.motion_level for c in clips],
                                 [c.seed for c in clips])
            for (output, _), clip_frames in zip(batch, frames, strict=True):
                output.frames = clip_frames
                output.seconds += watch.seconds / len(batch)
        for game_plan, out_dir in zip(planned, out_dirs, strict=True):
            for index, (output, _) in enumerate(game_plan):
                output.clip = _write_clip(output.frames, out_dir, index, self.renderer.fps)
        return [[output for output, _ in game_plan] for game_plan in planned]


# --------------------------------------------------------------------------------------------
# AnimeGamer
# --------------------------------------------------------------------------------------------


class AnimeGamerSystem(_Rendering):
    """The full game: MLLM next-state prediction with a sliding history, decoder rendering."""

    name = "animegamer"

    def __init__(self, game: AnimeGamer, device: str = "cpu"):
        self.game, self.device = game, device

    @property
    def renderer(self):
        return self.game.renderer

    @classmethod
    def from_config(cls, cfg: InferenceConfig, render: bool = True) -> AnimeGamerSystem:
        return cls(build_game(cfg, render=render), resolve_device(cfg.device))

    def plan_game(self, game: BenchmarkGame) -> list[tuple[TurnOutput, PlannedClip]]:
        """The game's turns by :meth:`AnimeGamer.play_turn` without rendering (the MLLM reads its own predicted
        shots as history, none of them needs a clip); each turn's clip as the game would render it."""
        watch = _Stopwatch(self.device)
        turns: list[Turn] = []  # every game starts from the initial state and an empty history
        planned = []
        for instruction in game.instructions:
            watch.seconds = 0.0
            turn = watch.timed(lambda text: self.game.play_turn(turns, text, render=False), instruction.render())
            turns.append(turn)
            output = TurnOutput(turn.instruction, turn.values, None, turn.values.motion_level, watch.seconds)
            planned.append((output, PlannedClip(turn.shot_embeds, turn.values.motion_level,
                                                turn_seed(self.game.seed, turn.index))))
        return planned

    def play_games(self, games: Sequence[BenchmarkGame], out_dirs: Sequence[str | Path | None],
                   render_batch: int = 1) -> list[list[TurnOutput]]:
        if self.renderer is None:  # state predictions only
            return [[output for output, _ in self.plan_game(game)] for game in games]
        return super().play_games(games, out_dirs, render_batch)


# --------------------------------------------------------------------------------------------
# Stage (a) encoder + decoder: GC baseline and reconstruction
# --------------------------------------------------------------------------------------------


class ShotEncoding:
    """s_a of (one frame, one text) with the stage (a) encoder: CLIP tokens + T5 tokens -> (N, H)."""

    def __init__(self, clip_features, t5, encoder, device: str):
        self.clip_features, self.t5, self.encoder, self.device = clip_features, t5, encoder, device

    @classmethod
    def from_config(cls, cfg: EvalConfig, device: str) -> ShotEncoding:
        on_gpu = device.startswith("cuda")
        clip_features = CLIPImageFeatures.from_config(cfg.clip).to(device).eval()
        t5 = T5TextFeatures.from_config(cfg.t5, dtype=torch.bfloat16 if on_gpu else torch.float32)
        t5 = t5.to(device).eval()
        if cfg.stage_a_checkpoint:
            encoder = load_encoder(cfg.stage_a_checkpoint, device=device)
        else:
            print("warning: stage_a_checkpoint is empty: the encoder is untrained", file=sys.stderr)
            torch.manual_seed(cfg.seed)
            encoder = ActionAwareEncoder.from_config(cfg.encoder).to(device).eval()
        return cls(clip_features, t5, encoder, device)

    @torch.no_grad()
    def encode(self, frame: np.ndarray, text: str) -> torch.Tensor:
        """(H, W, 3) uint8 frame + text -> s_a (N, H) float32 on the CPU."""
        pixels = torch.from_numpy(np.ascontiguousarray(frame))[None].permute(0, 3, 1, 2).to(self.device)  # (1,3,H,W)
        clip_tokens = self.clip_features(pixels)  # (1, Nc, Dc)
        text_tokens = self.t5([text])  # (1, 226, Dt)
        return self.encoder(clip_tokens.float(), text_tokens.float())[0].float().cpu()  # (N, H)


def load_shot_models(cfg: EvalConfig) -> tuple[ShotEncoding, AnimeGamer]:
    """The stage (a) encoder (with its CLIP and T5) and the game of ``cfg`` without a decoder (its MLLM), on its
    device, seeded: what the shot-level research tools (research/spriteworld/shot_error.py, friend_probe.py)
    compare. Missing or unreadable weights raise FileNotFoundError or ValueError."""

    device = resolve_device(cfg.inference.device)
    torch.manual_seed(cfg.seed)
    encoding = ShotEncoding.from_config(cfg, device)
    return encoding, build_game(dataclasses.replace(cfg.inference, offload="none"), render=False)


def load_stage_a_parts(cfg: EvalConfig) -> tuple[ShotEncoding, object]:
    """The stage (a) encoder (with its CLIP and T5 feature extractors) and the stage (a) decoder as a renderer."""

    encoding = ShotEncoding.from_config(cfg, resolve_device(cfg.inference.device))
    stage_a = with_decoder_checkpoint(cfg.inference, cfg.stage_a_checkpoint)
    return encoding, build_game(stage_a, mllm=False).renderer  # every inference option, as the game renders


def _write_clip(frames: np.ndarray, out_dir: str | Path | None, index: int, fps: int) -> str:
    """The game's clip layout (``out_dir/turn_<index>.mp4`` + ``.gif``), returning the mp4; nothing (and "") when
    ``out_dir`` is None."""

    if out_dir is None:
        return ""
    return str(write_clip(frames, clip_stem(out_dir, index), fps=fps)[0])


def grey_frame(height: int, width: int) -> np.ndarray:
    """The GC-style baseline's default reference: a mid-grey (H, W, 3) uint8 frame, so only the text informs s_a."""
    return np.full((height, width, 3), 128, np.uint8)


class GCBaseline(_Rendering):
    """The decoder driven by each instruction alone: fixed reference frame, fixed motion level, no history."""

    name = "gc_baseline"

    def __init__(self, encoding: ShotEncoding, renderer, *, motion_level: int, reference: str = "",
                 seed: int = 42, frame_size: tuple[int, int] = (480, 720)):
        if motion_level not in VALUE_RANGES["motion_level"]:
            raise ValueError(f"gc_baseline motion level {motion_level} is not one of {VALUE_RANGES['motion_level']}")
        self.encoding, self.renderer = encoding, renderer
        self.motion_level, self.reference, self.seed, self.frame_size = motion_level, reference, seed, frame_size

    def reference_frame(self, character: str) -> np.ndarray:
        """The fixed frame whose CLIP tokens stand in for a visual reference: grey, one image, or per character."""

        if not self.reference:
            return grey_frame(*self.frame_size)
        path = Path(self.reference)
        if path.is_dir():
            path = path / f"{character}.png"
        if not path.is_file():
            raise FileNotFoundError(f"gc_reference: reference image not found: {path}")
        return load_image(path)

    @property
    def device(self) -> str:
        return self.encoding.device

    def plan_game(self, game: BenchmarkGame) -> list[tuple[TurnOutput, PlannedClip]]:
        reference = self.reference_frame(game.character)
        watch = _Stopwatch(self.device)
        planned = []
        for index, instruction in enumerate(game.instructions):
            text = instruction.render()
            watch.seconds = 0.0
            shot = watch.timed(self.encoding.encode, reference, text)
            output = TurnOutput(text, None, None, self.motion_level, watch.seconds)
            planned.append((output, PlannedClip(shot, self.motion_level, turn_seed(self.seed, index))))
        return planned


class ReconstructionSystem(_Rendering):
    """Stage (a) on the ground truth: s_a of each real clip (first frame + its caption), decoded at its level."""

    name = "reconstruction"

    def __init__(self, encoding: ShotEncoding, renderer, *, seed: int = 42):
        self.encoding, self.renderer, self.seed = encoding, renderer, seed

    @property
    def device(self) -> str:
        return self.encoding.device

    def plan_game(self, game: BenchmarkGame) -> list[tuple[TurnOutput, PlannedClip]]:
        if not isinstance(game, GroundTruthGame) or not game.has_clips():
            raise ValueError(f"{game.game_id}: the reconstruction system needs games with ground-truth clips "
                             "(a games directory written by scripts/spriteworld/make.py)")
        watch = _Stopwatch(self.device)
        planned = []
        for index, shot in enumerate(game.shots):
            first = game.clip_frames(index)[0]
            level = shot.values.motion_level
            watch.seconds = 0.0
            embeds = watch.timed(self.encoding.encode, first, game.caption(index))
            output = TurnOutput(shot.instruction().render(), None, None, level, watch.seconds)
            planned.append((output, PlannedClip(embeds, level, turn_seed(self.seed, index))))
        return planned


class GroundTruthSystem(_TurnByTurn):
    """The real clips themselves, resized to the sampling size: the ceiling of every clip metric.

    Its ACC-F / MAE-F say how well the flow meter recovers the data's own motion levels (the most any generated
    clip can score); its CLIP-T is the text alignment of real clips. No model runs.
    """

    name = "ground_truth"

    def __init__(self, height: int, width: int, fps: int):
        self.height, self.width, self.fps = height, width, fps

    def play_game(self, game: BenchmarkGame, out_dir: str | Path | None) -> list[TurnOutput]:
        if not isinstance(game, GroundTruthGame) or not game.has_clips():
            raise ValueError(f"{game.game_id}: the ground_truth system needs games with ground-truth clips "
                             "(a games directory written by scripts/spriteworld/make.py)")
        outputs = []
        for index, shot in enumerate(game.shots):
            real = game.clip_frames(index)  # (T, H', W', 3)
            frames = fit_frames(real, len(real), self.height, self.width).numpy()  # (T, H, W, 3)
            clip = _write_clip(frames, out_dir, index, self.fps)
            outputs.append(TurnOutput(shot.instruction().render(), None, frames, shot.values.motion_level, 0.0, clip))
        return outputs


# --------------------------------------------------------------------------------------------
# State-only floors
# --------------------------------------------------------------------------------------------


def majority_values(records: Sequence[ClipRecord]) -> StateValues:
    """The most common value of every state field over the tagged clips (ties go to the smaller value)."""
    tags = [r.shot_tags() for r in records if r.tags]
    if not tags:
        raise ValueError("no tagged clips to take the majority classes from")
    chosen = {}
    for name in VALUE_RANGES:
        counts = Counter(getattr(t.values, name) for t in tags)
        chosen[name] = max(sorted(counts), key=lambda v: counts[v])  # max keeps the first (smallest) of a tie
    return StateValues(**chosen)


class MajorityClassSystem(_TurnByTurn):
    """Predicts the training set's most common motion level and state values every turn; renders nothing."""

    name = "majority"

    def __init__(self, values: StateValues):
        self.values = values

    def play_game(self, game: BenchmarkGame, out_dir: str | Path | None) -> list[TurnOutput]:
        return [TurnOutput(i.render(), self.values, None, self.values.motion_level, 0.0) for i in game.instructions]


class RandomSystem(_TurnByTurn):
    """Uniformly random motion level and state values (seeded per game); renders nothing."""

    name = "random"

    def __init__(self, seed: int = 42):
        self.seed = seed

    def play_game(self, game: BenchmarkGame, out_dir: str | Path | None) -> list[TurnOutput]:
        # Seeded by the game id, so a game's draws do not depend on which games ran before it.
        rng = np.random.default_rng([self.seed, *game.game_id.encode("utf-8")])
        outputs = []
        for instruction in game.instructions:
            values = StateValues(**{name: int(rng.choice(allowed)) for name, allowed in VALUE_RANGES.items()})
            outputs.append(TurnOutput(instruction.render(), values, None, values.motion_level, 0.0))
        return outputs


def build_system(name: str, cfg: EvalConfig, training_clips: Sequence[ClipRecord] = ()) -> System:
    """The system ``name`` of an eval config; ``training_clips`` (tagged) give majority classes and levels."""
    if name == "animegamer":
        return AnimeGamerSystem.from_config(cfg.inference)
    if name in ("gc_baseline", "reconstruction"):
        encoding, renderer = load_stage_a_parts(cfg)
        if name == "reconstruction":
            return ReconstructionSystem(encoding, renderer, seed=cfg.inference.seed)
        if cfg.gc_motion_level:
            level = cfg.gc_motion_level
        elif training_clips:
            level = majority_values(training_clips).motion_level
        else:
            raise ValueError("gc_baseline needs gc_motion_level=1..5 or a motion_manifest with tagged training clips")
        size = (cfg.inference.sampling.height, cfg.inference.sampling.width)
        # The same seed as the animegamer system: turn i starts from the same noise in both.
        return GCBaseline(encoding, renderer, motion_level=level, reference=cfg.gc_reference,
                          seed=cfg.inference.seed, frame_size=size)
    if name == "ground_truth":
        sampling = cfg.inference.sampling
        return GroundTruthSystem(sampling.height, sampling.width, sampling.fps)
    if name == "random":
        return RandomSystem(cfg.seed)
    if name == "majority":
        if not training_clips:
            raise ValueError("the majority system needs a motion_manifest with tagged training clips")
        return MajorityClassSystem(majority_values(training_clips))
    raise ValueError(f"unknown system {name!r}; choose from {list(SYSTEMS)}")
