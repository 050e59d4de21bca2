"""Stage (b) windows: consecutive shots of one film as one multi-turn sequence, and the train/test split.

A film's clips, in ``clip_index`` order, are cut into *runs*: maximal stretches of captioned clips (``tags`` set)
whose ``clip_index`` values are consecutive. An uncaptioned clip or a gap in the numbering (a dropped clip) ends a
run, since the story is not continuous across it. Every clip of a run whose position ``t`` is a multiple of
``stride`` is the current turn of one window; its history is the up to ``history_turns`` clips before it in the run::

    run  c0 c1 c2 c3 c4      history_turns=2, stride=1
    ->   [c0] [c0 c1] [c0 c1 c2] [c1 c2 c3] [c2 c3 c4]

so early turns see a short history, as the first turns of a game do. With ``all_history_lengths`` every turn also
gets a window for each shorter history, down to none (``[c3] [c2 c3] [c1 c2 c3]`` for c3). Runs with fewer than
``min_turns`` clips are dropped. With ``reach_field``, a window whose history is shorter than its current clip's
``extra[reach_field]`` (how many turns back what the instruction leaves unsaid was shown) is dropped: its target
cannot be read from it, and training on it teaches the average of the possible answers.

Split (``DataConfig.split_by``):
  film  whole films go to test, chosen by a stable hash of ``film_id`` (round(n * test_fraction), at least one when
        there are two or more films and test_fraction > 0); a film is never in both splits.
  time  each film's clips are cut in time: the first (1 - test_fraction) of its clips (by ``clip_index``) train,
        the rest test (the paper's 8:2 single-film ablation). Runs are formed after the cut, so no window crosses it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from animegamer.config import DataConfig
from animegamer.data.manifest import ClipRecord, Manifest

SPLITS = ("train", "test", "all")


@dataclass(frozen=True)
class Window:
    """One stage (b) sample: clip ids oldest first; the last is the current turn, the others its history."""

    film_id: str
    clip_ids: tuple[str, ...]

    @property
    def current(self) -> str:
        return self.clip_ids[-1]

    @property
    def history(self) -> tuple[str, ...]:
        return self.clip_ids[:-1]


def _film_rank(film_id: str) -> str:
    return hashlib.sha1(film_id.encode("utf-8")).hexdigest()


def split_films(film_ids: list[str], test_fraction: float) -> tuple[list[str], list[str]]:
    """(train films, test films), deterministic in the film ids alone (adding a film moves no other film)."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must be in [0, 1)")
    ranked = sorted(set(film_ids), key=_film_rank)
    n_test = round(len(ranked) * test_fraction)
    if test_fraction > 0 and len(ranked) >= 2:
        n_test = min(max(1, n_test), len(ranked) - 1)
    test = set(ranked[:n_test])
    return sorted(f for f in ranked if f not in test), sorted(test)


def split_in_time(clips: list[ClipRecord], test_fraction: float) -> tuple[list[ClipRecord], list[ClipRecord]]:
    """(train clips, test clips) of one film: the first (1 - test_fraction) of its clips by ``clip_index``."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must be in [0, 1)")
    ordered = sorted(clips, key=lambda r: r.clip_index)
    cut = round(len(ordered) * (1.0 - test_fraction))
    return ordered[:cut], ordered[cut:]


def runs(clips: list[ClipRecord]) -> list[list[ClipRecord]]:
    """Maximal stretches of captioned clips with consecutive ``clip_index`` (input: one film's clips)."""
    out: list[list[ClipRecord]] = []
    current: list[ClipRecord] = []
    for record in sorted(clips, key=lambda r: r.clip_index):
        if not record.tags:
            if current:
                out.append(current)
            current = []
            continue
        if current and record.clip_index != current[-1].clip_index + 1:
            out.append(current)
            current = []
        current.append(record)
    if current:
        out.append(current)
    return out


def clip_reach(record: ClipRecord, reach_field: str) -> int:
    """``record.extra[reach_field]``: how many history turns the clip's target needs (0 when the field is unset)."""
    if not reach_field:
        return 0
    value = record.extra.get(reach_field, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"clip {record.clip_id}: extra.{reach_field}={value!r} is not a count of turns (int >= 0)")
    return value


def windows_of_run(
    run: list[ClipRecord],
    history_turns: int,
    stride: int = 1,
    all_history_lengths: bool = False,
    reach_field: str = "",
) -> list[Window]:
    """The windows whose current turns are the run's clips at positions 0, stride, 2*stride, ...

    One window per current turn with the longest history available, or, with ``all_history_lengths``, one for
    each history length from the longest down to none; with ``reach_field``, only histories of at least the
    current clip's reach.
    """
    if history_turns < 0 or stride < 1:
        raise ValueError(f"need history_turns >= 0 and stride >= 1 (got {history_turns}, {stride})")
    ids = [r.clip_id for r in run]
    windows = []
    for t in range(0, len(run), stride):
        longest = min(t, history_turns)
        shortest = clip_reach(run[t], reach_field)
        for h in range(longest, -1, -1) if all_history_lengths else (longest,):
            if h >= shortest:
                windows.append(Window(run[t].film_id, tuple(ids[t - h : t + 1])))
    return windows


def build_windows(
    manifest: Manifest,
    history_turns: int,
    stride: int = 1,
    min_turns: int = 1,
    split: str = "train",
    test_fraction: float = 0.2,
    split_by: str = "film",
    all_history_lengths: bool = False,
    reach_field: str = "",
) -> list[Window]:
    """All windows of one split of the manifest, film by film (films sorted by id, runs in time order)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {SPLITS}")
    films = manifest.films()
    if split_by == "film":
        train_films, test_films = split_films(list(films), test_fraction)
        chosen = {"train": train_films, "test": test_films, "all": sorted(films)}[split]
        if not chosen:
            raise ValueError(
                f"{manifest.path}: split {split!r} has no films ({len(films)} film(s), test_fraction={test_fraction});"
                " with a single film use data.split_by=time"
            )
        parts = {film: films[film] for film in chosen}
    elif split_by == "time":
        parts = {}
        for film, clips in films.items():
            train_clips, test_clips = split_in_time(clips, test_fraction)
            parts[film] = {"train": train_clips, "test": test_clips, "all": clips}[split]
    else:
        raise ValueError(f"split_by={split_by!r} is not one of ('film', 'time')")
    windows: list[Window] = []
    for clips in parts.values():
        for run in runs(clips):
            if len(run) >= min_turns:
                windows += windows_of_run(run, history_turns, stride, all_history_lengths, reach_field)
    return windows


def windows_from_config(manifest: Manifest, data: DataConfig) -> list[Window]:
    return build_windows(
        manifest,
        history_turns=data.history_turns,
        stride=data.sequence_stride,
        min_turns=data.min_sequence_turns,
        split=data.split,
        test_fraction=data.test_fraction,
        split_by=data.split_by,
        all_history_lengths=data.all_history_lengths,
        reach_field=data.reach_field,
    )
