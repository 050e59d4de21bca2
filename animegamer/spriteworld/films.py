"""SpriteWorld's films, the dataset on disk and its held-out games.

A film is a Markov chain of shots: plausible successions (sleep -> eat -> walk ...), places that return, and a
clock that moves from morning to night (and back to morning after a night's sleep). Films are split into
train/test by film; held-out films become game files with ground truth (:func:`write_games`).

``memory: true`` adds what a film keeps without saying it (its own home, a friend who follows) and instructions
that leave out what earlier turns fixed; ``held_out_pairs`` keeps (character, action) / (character, friend) pairs
out of the training films (:mod:`animegamer.spriteworld.memory`). Both off: the plain world, bit for bit.

    python scripts/spriteworld/make.py --config configs/spriteworld/data.yaml
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from animegamer.data.manifest import ClipRecord, write_manifest
from animegamer.data.video import write_mp4
from animegamer.io import atomic_write_jsonl, atomic_write_text
from animegamer.spriteworld.animate import animate, draw_scene, fit_motion_bins, motion_level, scene_motion
from animegamer.spriteworld.memory import (
    COME_BACK,
    HeldOutPairs,
    ShotMemory,
    allowed_weights,
    caption_text,
    film_memory,
)
from animegamer.spriteworld.world import ACTIONS, CHARACTERS, HOME, PLACES, TIMES, TRANSITIONS, ShotSpec
from animegamer.states import ShotTags

if TYPE_CHECKING:
    from animegamer.config import SpriteWorldConfig

@dataclass
class Film:
    film_id: str
    split: str  # train | test
    shots: list[ShotSpec]
    seeds: list[int]  # render seed of each shot
    friend: str = ""  # the film's friend: of its social shots, and its companion in a memory film


def _choose(rng: np.random.Generator, weights: dict[str, float]) -> str:
    names = list(weights)
    p = np.array([weights[n] for n in names], np.float64)
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def _next_place(rng: np.random.Generator, action: str, place: str | None, visited: list[str]) -> str:
    """Mostly stay; otherwise go where the action usually happens, or back to a place of this film."""
    allowed = ACTIONS[action].places
    home = HOME.get(action)
    if place in allowed and rng.random() < (0.3 if home and place != home else 0.7):
        return place
    weights = {p: (3.0 if p in visited else 1.0) * (4.0 if home == p else 1.0) for p in allowed}
    return _choose(rng, weights)


def plan_film(rng: np.random.Generator, hero: str, friend: str, num_shots: int, banned: tuple[str, ...] = (),
              boosted: tuple[str, ...] = (), come_back: float = 0.0) -> list[ShotSpec]:
    """One film's shots: actions follow TRANSITIONS, places mostly stay or return, the clock moves on.

    ``banned`` actions never happen (held-out pairs of a training film), ``boosted`` ones are likelier (of a
    held-out film); with neither, the draws are those of the world without held-out pairs. ``come_back`` (memory
    films) is the chance that, one or two shots after the hero left a place, the next shot returns there (when the
    action can happen there): short trips out and back, which a memory instruction says as ``back``."""
    # waking up, breakfast, a morning walk
    action = _choose(rng, allowed_weights({"sleep": 3, "eat": 2, "read": 1, "walk": 2}, banned, ()))
    time = 0 if action == "sleep" else int(rng.choice(3, p=[0.5, 0.3, 0.2]))
    place = _next_place(rng, action, None, [])
    visited: list[str] = []
    previous, stretch = "", 0  # the place before the current one, and the shots so far at the current one
    shots = []
    for _ in range(num_shots):
        a = ACTIONS[action]
        adverb = a.adverbs[int(rng.integers(len(a.adverbs)))]
        shots.append(ShotSpec(hero, action, place, TIMES[time], adverb, friend if a.social else ""))
        visited.append(place)
        stretch += 1
        if action == "sleep" and TIMES[time] == "night":
            time = 0  # a new day
        elif TIMES[time] != "night" and rng.random() < 0.35:
            time += 1
        weights = dict(TRANSITIONS[action])
        if TIMES[time] == "night":
            weights["sleep"] = weights.get("sleep", 0.0) + 6.0
        elif "sleep" in weights:
            weights["sleep"] *= 0.2
        action = _choose(rng, allowed_weights(weights, banned, boosted))
        next_place = _next_place(rng, action, place, visited)
        if (come_back and previous and stretch <= 2 and previous in ACTIONS[action].places
                and rng.random() < come_back):
            next_place = previous
        if next_place != place:
            previous, stretch = place, 0
        place = next_place
    return shots


def plan_films(seed: int, num_films: int, shots_per_film: int, characters: list[str],
               test_fraction: float, held_out: HeldOutPairs | None = None, come_back: float = 0.0) -> list[Film]:
    """All films of a dataset, deterministic in ``seed``; protagonists cycle through ``characters``.

    ``held_out`` pairs (memory.py) never occur in training films; a held-out film of a hero with a
    held-out friend has that friend, and its hero's held-out actions are likelier."""
    held_out = held_out or HeldOutPairs()
    unknown = [c for c in characters if c not in CHARACTERS]
    if unknown or not characters:
        raise ValueError(f"characters must be a non-empty subset of {list(CHARACTERS)}, got {characters}")
    if num_films < 1 or shots_per_film < 1:
        raise ValueError("num_films and shots_per_film must be >= 1")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    num_test = min(num_films - 1, max(1 if test_fraction > 0 else 0, round(test_fraction * num_films)))
    test = set(rng.permutation(num_films)[:num_test].tolist())
    films = []
    for i in range(num_films):
        hero = characters[i % len(characters)]
        test_film = i in test
        never = held_out.banned_friends(hero)
        others = [c for c in CHARACTERS if c != hero and (c in never if test_film and never else c not in never)]
        friend = others[int(rng.integers(len(others)))]
        banned = held_out.banned_actions(hero)
        shots = plan_film(rng, hero, friend, shots_per_film, () if test_film else banned, banned if test_film else (),
                          come_back)
        seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=shots_per_film)]
        films.append(Film(f"film{i:04d}", "test" if test_film else "train", shots, seeds, friend))
    return films


# --------------------------------------------------------------------------------------------
# The dataset on disk and held-out games
# --------------------------------------------------------------------------------------------

CLIP_SECONDS = 2.0  # consecutive shots fill consecutive 2 s slots of their film


def plan_world(cfg: SpriteWorldConfig) -> tuple[list[Film], dict[str, list[ShotMemory]]]:
    """The films of ``cfg`` and, when it has memory or held-out pairs, every shot's :class:`ShotMemory` by film
    (its instruction's words, home, companion and marks; memory.py), else an empty dict."""
    held_out = HeldOutPairs.parse(cfg.held_out_pairs)
    films = plan_films(cfg.seed, cfg.num_films, cfg.shots_per_film, list(cfg.characters), cfg.test_fraction,
                       held_out, COME_BACK if cfg.memory and cfg.back else 0.0)
    if not (cfg.memory or cfg.held_out_pairs):
        return films, {}
    return films, {
        film.film_id: film_memory(np.random.default_rng([cfg.seed, 1, index]), film.shots, film.friend, held_out,
                                  cfg.memory, cfg.back)
        for index, film in enumerate(films)
    }


def training_tags(cfg: SpriteWorldConfig, motion_level: int = 1) -> list[ShotTags]:
    """The tag lines of every shot of the training films of ``cfg`` as its records carry them (memory films: as
    their instructions say them), with ``motion_level`` in place of the measured one (no clip is drawn)."""
    films, memories = plan_world(cfg)
    return [memories[f.film_id][i].tags(shot, motion_level) if memories else shot.tags(motion_level)
            for f in films if f.split == "train" for i, shot in enumerate(f.shots)]


def write_dataset(cfg: SpriteWorldConfig, progress: bool = True) -> Path:
    """Render every film of ``cfg`` to ``output_dir``: clips/<film>/<index>.mp4, clips.jsonl + clips.meta.json
    (motion bin edges, splits) and games/<film>.{txt,jsonl} for the test films. Returns the manifest path."""
    from tqdm import tqdm

    out = Path(cfg.output_dir)
    films, memories = plan_world(cfg)
    marked = bool(memories)
    total = sum(len(f.shots) for f in films)
    scopes: list[float] = []
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(max(1, cfg.workers)) as pool, tqdm(total=total, desc="spriteworld", unit="clip",
                                                                  disable=not progress) as bar:
        for film in films:
            for index, (spec, seed) in enumerate(zip(film.shots, film.seeds, strict=True)):
                memory = memories[film.film_id][index] if marked else None
                scene = animate(spec, seed, height=cfg.height, width=cfg.width, num_frames=cfg.num_frames,
                                blocking=cfg.blocking, speed_jitter=cfg.speed_jitter,
                                home=memory.home if memory else None, companion=memory.companion if memory else "")
                scopes.append(scene_motion(scene))
                path = out / "clips" / film.film_id / f"{index:05d}.mp4"
                pending.append(pool.submit(write_mp4, path, draw_scene(scene), cfg.fps))
                while len(pending) > 4 * max(1, cfg.workers):  # bound the frames waiting in memory
                    pending.popleft().result()
                    bar.update()
        while pending:
            pending.popleft().result()
            bar.update()

    bins = fit_motion_bins(scopes)
    records, i = [], 0
    for film in films:
        for index, (spec, seed) in enumerate(zip(film.shots, film.seeds, strict=True)):
            scope = scopes[i]
            i += 1
            level = motion_level(scope, bins)
            memory = memories[film.film_id][index] if marked else None
            records.append(ClipRecord(
                clip_id=f"{film.film_id}_{index:05d}", video=f"clips/{film.film_id}/{index:05d}.mp4",
                film_id=film.film_id, clip_index=index, start=CLIP_SECONDS * index, end=CLIP_SECONDS * (index + 1),
                tags=(memory.tags(spec, level) if memory else spec.tags(level)).render(),
                motion_scope=round(scope, 5), motion_level=level, caption_status="ok",
                extra={**spec.to_dict(), "render_seed": seed, "blocking": cfg.blocking,
                       "speed_jitter": cfg.speed_jitter, "num_frames": cfg.num_frames, "height": cfg.height,
                       "width": cfg.width, "split": film.split, **(memory.extra() if memory else {})},
            ))
    meta = {
        "source": "spriteworld",
        # Same place as the real pipeline's edges (animegamer.data.motion); the method says they measure true
        # motion, so a flow scorer refuses them: score generated clips with edges refitted by flow on these clips.
        "motion": {
            "method": "true_motion", "edges": bins, "height": cfg.height, "width": cfg.width, "fps": float(cfg.fps),
            "definition": "mean per-frame displacement (pixels at the clip size) of the characters' head, torso, "
                          "hands and feet, weighted by their share of the figure",
        },
        "splits": {s: [f.film_id for f in films if f.split == s] for s in ("train", "test")},
        "config": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in vars(cfg).items()},
        "characters": list(CHARACTERS), "actions": list(ACTIONS), "places": list(PLACES), "times": list(TIMES),
    }
    manifest = write_manifest(out / "clips.jsonl", records, meta)
    write_games(out / "games", [r for r in records if r.extra["split"] == "test"])
    return manifest


# render_shot's keywords, kept per clip (home / companion: memory films only)
DRAWING_SETTINGS = ("blocking", "speed_jitter", "num_frames", "height", "width", "home", "companion")


def drawing_settings(row: dict[str, Any]) -> dict[str, Any]:
    """The :func:`render_shot` keywords a clip record's ``extra`` or a game row carries, so the clip can be drawn
    again exactly; settings it lacks take render_shot's defaults, except blocking: rows written before blocking
    existed were drawn free."""
    return {"blocking": "free", **{k: row[k] for k in DRAWING_SETTINGS if row.get(k) is not None}}


def film_game(records: list[ClipRecord]) -> list[dict[str, Any]]:
    """One film's clips (in order) as game turns: the instruction a player would type and the ground truth."""
    turns = []
    for turn, record in enumerate(sorted(records, key=lambda r: r.clip_index)):
        tags = record.shot_tags()
        if tags is None:
            raise ValueError(f"{record.clip_id}: no tags, cannot be a game turn")
        turns.append({
            "turn": turn, "instruction": tags.instruction().render(), "tags": record.tags, "clip_id": record.clip_id,
            "caption": caption_text(record),  # what stage (a) reads for the real clip (the reconstruction system)
            "video": record.video, "motion_scope": record.motion_scope, "motion_level": record.motion_level,
            "spec": {k: record.extra[k] for k in ("character", "action", "place", "time", "adverb", "friend")},
            "render_seed": record.extra.get("render_seed"),
            **drawing_settings(record.extra),
            # the turn's marks (memory world / held-out pairs): what it depends on, whether it pairs held-out
            **{k: record.extra[k] for k in ("depends", "held_out_pair", "reach") if k in record.extra},
        })
    return turns


def write_games(out_dir: str | Path, records: list[ClipRecord], kind: str = "held-out") -> list[Path]:
    """Write ``<film>.txt`` (a game file for read_game_file) and ``<film>.jsonl`` (its ground truth per turn,
    videos relative to the manifest directory) for every film among ``records``. Games of an earlier run in
    ``out_dir`` are removed, so the directory holds exactly this dataset's held-out games. ``kind`` names the films
    in each game file's header (``held-out``; ``training-film`` for research/spriteworld/train_games.py)."""
    out_dir = Path(out_dir)
    if out_dir.is_dir():
        for old in [*out_dir.glob("*.txt"), *out_dir.glob("*.jsonl")]:
            old.unlink()
    films: dict[str, list[ClipRecord]] = {}
    for r in records:
        films.setdefault(r.film_id, []).append(r)
    written = []
    for film_id, clips in sorted(films.items()):
        turns = film_game(clips)
        header = f"# SpriteWorld {kind} game {film_id}: {len(turns)} turns; ground truth in {film_id}.jsonl\n"
        atomic_write_text(out_dir / f"{film_id}.txt", header + "".join(t["instruction"] + "\n" for t in turns))
        atomic_write_jsonl(out_dir / f"{film_id}.jsonl", turns)
        written.append(out_dir / f"{film_id}.txt")
    return written
