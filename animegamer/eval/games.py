"""The games an evaluation plays, with their ground truth: LLM-written benchmark games or held-out data games.

Three sources are read by :func:`load_games`:

- a benchmark directory (``benchmark.json``, written by scripts/make_benchmark.py): instructions and ground-truth
  states per turn, no ground-truth clips;
- a games directory of held-out films (``<film>.txt`` + ``<film>.jsonl``, written by scripts/spriteworld/make.py):
  instructions, states *and* the real clip of every turn (``video`` relative to the manifest directory, the parent
  of the games directory; SpriteWorld rows also carry the shot spec and render seed, so a missing video is drawn
  again). Those clips make CLIP-I paired, PSNR / SSIM and the ``reconstruction`` system possible;
- a clip manifest (``clips.jsonl`` of scripts/prepare_data.py): the tagged clips of its test films (the meta's
  ``splits``, else the film split of stage b) in order, cut into games of ``turns_per_game`` turns, with real clips.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from animegamer.config import DataConfig
from animegamer.data.manifest import read_manifest
from animegamer.data.sequences import split_films
from animegamer.data.video import read_video
from animegamer.eval.benchmark import INDEX_NAME, BenchmarkError, BenchmarkGame, load_benchmark
from animegamer.io import iter_jsonl
from animegamer.spriteworld import ShotSpec, drawing_settings, render_shot
from animegamer.spriteworld.identity import TurnCast
from animegamer.states import ShotTags, parse_tags


@dataclass(frozen=True)
class GroundTruthGame(BenchmarkGame):
    """A benchmark game whose turns also have their real clip (``clips[turn]``: a video path or a shot spec)."""

    # per turn: {"video": path} and/or {"spec", "render_seed"} + spriteworld.films.drawing_settings (blocking ...)
    clips: tuple[dict, ...] = ()
    # per turn: {"depends": "full" | "history" | "new", "held_out_pair": bool, "reach": int} (SpriteWorld's memory
    # world, animegamer.spriteworld.memory), or ()
    marks: tuple[dict, ...] = ()
    # per turn: the real clip's caption, the text stage (a) encodes with its first frame (may say what the
    # instruction leaves out: a SpriteWorld memory film's home, the companion), or () to use the tags' motion text
    captions: tuple[str, ...] = ()

    def caption(self, turn: int) -> str:
        """The text stage (a) encodes for the real clip of ``turn``."""
        return self.captions[turn] if self.captions else self.shots[turn].motion_text()

    def has_clips(self) -> bool:
        return len(self.clips) == len(self.shots) > 0

    def clip_frames(self, turn: int) -> np.ndarray:
        """The ground-truth clip of ``turn`` as (T, H, W, 3) uint8: the stored video, else drawn from its spec."""

        source = self.clips[turn]
        video = source.get("video")
        if video and Path(video).is_file():
            frames, _ = read_video(video)
            return frames
        if source.get("spec") is not None and source.get("render_seed") is not None:

            return render_shot(ShotSpec(**source["spec"]), int(source["render_seed"]), **drawing_settings(source))
        raise FileNotFoundError(f"{self.path}: ground-truth clip of turn {turn} not found ({video or 'no video'})")

    def cast(self, turn: int) -> TurnCast | None:
        """Who the real clip of ``turn`` shows (protagonist, friend in view, named or not) when it is a SpriteWorld
        shot (a spec to draw it from), else None."""
        source = self.clips[turn] if self.has_clips() else {}
        if source.get("spec") is None:
            return None
        return TurnCast.from_row(source["spec"], source, self.instructions[turn].render())


def _read_data_game(jsonl: Path) -> GroundTruthGame:
    root = jsonl.parent.parent  # videos are relative to the manifest directory
    shots: list[ShotTags] = []
    clips: list[dict] = []
    marks: list[dict] = []
    captions: list[str] = []
    for number, row in iter_jsonl(jsonl, BenchmarkError):
        if not isinstance(row, dict) or "tags" not in row or row.get("turn") != len(shots):
            raise BenchmarkError(f"{jsonl}:{number}: expected turn {len(shots)} with a 'tags' line")
        shots.append(parse_tags(str(row["tags"]), source=str(jsonl), line=number))
        clip: dict = {}
        if row.get("video"):
            clip["video"] = str(root / row["video"])
        if row.get("spec") is not None:  # a SpriteWorld turn: its clip can be drawn again

            clip["spec"], clip["render_seed"] = row["spec"], row.get("render_seed")
            clip.update(drawing_settings(row))
        clips.append(clip)
        if row.get("caption") is not None:
            if not isinstance(row["caption"], str) or not row["caption"].strip():
                raise BenchmarkError(f"{jsonl}:{number}: 'caption' must be a non-empty string")
            captions.append(row["caption"])
        if row.get("depends") is not None:
            marks.append({"depends": str(row["depends"]), "held_out_pair": bool(row.get("held_out_pair", False)),
                          "reach": int(row.get("reach", 0))})
    if not shots:
        raise BenchmarkError(f"{jsonl}: no turns")
    characters = {shot.subject for shot in shots}
    if len(characters) != 1:
        raise BenchmarkError(f"{jsonl}: a game follows one character, found {sorted(characters)}")
    has_all = all(clips)
    return GroundTruthGame(jsonl.stem, shots[0].subject, tuple(shots), jsonl, tuple(clips) if has_all else (),
                           tuple(marks) if len(marks) == len(shots) else (),
                           tuple(captions) if len(captions) == len(shots) else ())


def games_from_manifest(path: str | Path, turns_per_game: int = 10) -> list[GroundTruthGame]:
    """The test films of a clip manifest as games: consecutive tagged clips, ``turns_per_game`` per game.

    A game's character is the most common subject of its shots (real films change protagonists).
    """
    from collections import Counter

    manifest = read_manifest(path)
    test = manifest.meta.get("splits", {}).get("test")
    if test is None:
        _, test = split_films([r.film_id for r in manifest.records], DataConfig().test_fraction)
    games = []
    for film_id, records in manifest.films().items():
        if film_id not in test:
            continue
        tagged = [r for r in records if r.tags]
        for start in range(0, len(tagged), turns_per_game):
            chunk = tagged[start : start + turns_per_game]
            shots = tuple(r.shot_tags() for r in chunk)
            character = Counter(shot.subject for shot in shots).most_common(1)[0][0]
            clips = tuple({"video": str(manifest.video_path(r))} for r in chunk)
            games.append(GroundTruthGame(f"{film_id}_{start // turns_per_game:03d}", character, shots,
                                         Path(path), clips))
    if not games:
        raise BenchmarkError(f"{path}: no tagged clips in its test films")
    return games


def load_games(path: str | Path, max_games: int = 0) -> list[BenchmarkGame]:
    """The games of ``path`` (the first ``max_games`` if > 0): a benchmark dir, a games dir or a clip manifest."""
    root = Path(path)
    if root.is_file() and root.suffix == ".jsonl":
        games = games_from_manifest(root)
        return games[:max_games] if max_games > 0 else games
    if (root / INDEX_NAME).is_file():
        return load_benchmark(root, max_games)
    files = sorted(root.glob("*.jsonl")) if root.is_dir() else []
    if not files:
        raise BenchmarkError(
            f"{root}: neither a benchmark ({INDEX_NAME}, scripts/make_benchmark.py) nor a games directory "
            "(<film>.jsonl, scripts/spriteworld/make.py)"
        )
    games = [_read_data_game(f) for f in (files[:max_games] if max_games > 0 else files)]
    return games
