"""SpriteWorld: determinism, tag rules, motion levels from the true motion, continuity, the manifest, the split,
recognisable pictures, games."""

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from animegamer.config import SpriteWorldConfig, load_config
from animegamer.data.manifest import read_manifest
from animegamer.data.video import read_video
from animegamer.spriteworld.animate import animate, fit_motion_bins, motion_level, motion_scope, render_shot
from animegamer.spriteworld.draw import background
from animegamer.spriteworld.films import plan_films, write_dataset
from animegamer.spriteworld.memory import lexicon
from animegamer.spriteworld.world import (
    ACTIONS,
    ADVERB_SPEED,
    CHARACTERS,
    PLACES,
    TIMES,
    TRANSITIONS,
    ShotSpec,
    spec_from_instruction,
)
from animegamer.states import TagError, parse_instruction, parse_tags, read_game_file
from tests.helpers.spriteworld import SPEC_KEYS, colour_mask, small_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("spriteworld")
    return read_manifest(write_dataset(small_config(out), progress=False))


def _spec(record) -> ShotSpec:
    return ShotSpec(**{k: record.extra[k] for k in SPEC_KEYS})


def _sample(num_films=24, seed=5):
    """Specs and their true motion for many shots, without writing video."""
    films = plan_films(seed, num_films, 12, list(CHARACTERS), 0.2)
    return [(s, motion_scope(s, sd)) for f in films for s, sd in zip(f.shots, f.seeds, strict=True)]


# -------------------------------------------------------------------------------- determinism


def test_render_is_deterministic_in_the_seed():
    spec = ShotSpec("Kai", "run", "park", "noon", "quickly")
    a, b, c = render_shot(spec, 3), render_shot(spec, 3), render_shot(spec, 4)
    assert a.shape == (17, 64, 96, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert motion_scope(spec, 3) == motion_scope(spec, 3) != motion_scope(spec, 4)
    small = render_shot(spec, 3, height=48, width=64, num_frames=9)
    assert small.shape == (9, 48, 64, 3)


def test_dataset_is_deterministic(tmp_path):
    paths = [write_dataset(small_config(tmp_path / name, num_films=2, shots_per_film=3, seed=seed), progress=False)
             for name, seed in (("a", 0), ("b", 0), ("c", 1))]
    rerun = write_dataset(small_config(tmp_path / "a", num_films=3, shots_per_film=2, test_fraction=0.34),
                          progress=False)
    assert sorted(p.name for p in (rerun.parent / "games").iterdir()) == ["film0002.jsonl", "film0002.txt"]
    paths[0] = write_dataset(small_config(tmp_path / "a", num_films=2, shots_per_film=3, seed=0), progress=False)
    text = [p.read_text() for p in paths]
    meta = [p.with_suffix(".meta.json").read_text().replace(str(p.parent), "") for p in paths]
    assert text[0] == text[1] and meta[0] == meta[1]
    assert text[0] != text[2]
    first = [read_video(p.parent / "clips/film0000/00001.mp4")[0] for p in paths]
    assert np.array_equal(first[0], first[1]) and not np.array_equal(first[0], first[2])


# -------------------------------------------------------------------------------- manifest, split, games


def test_manifest_times_split_and_videos(dataset):
    assert len(dataset) == 6 * 8 and len(dataset.films()) == 6
    for film_id, clips in dataset.films().items():
        assert [c.clip_index for c in clips] == list(range(8))
        assert [(c.start, c.end) for c in clips] == [(2.0 * i, 2.0 * i + 2.0) for i in range(8)]
        assert {c.extra["split"] for c in clips} == {"test" if film_id in dataset.meta["splits"]["test"] else "train"}
    splits = dataset.meta["splits"]
    assert not set(splits["train"]) & set(splits["test"]) and len(splits["test"]) == 2
    assert sorted(splits["train"] + splits["test"]) == sorted(dataset.films())
    edges = dataset.meta["motion"]["edges"]
    assert len(edges) == 4 and edges == sorted(edges)
    record = dataset.records[5]
    frames, fps = read_video(dataset.video_path(record))
    assert frames.shape == (17, 64, 96, 3) and fps == pytest.approx(8)
    truth = render_shot(_spec(record), record.extra["render_seed"])
    assert np.abs(frames.astype(int) - truth.astype(int)).mean() < 6  # the same picture through a lossy codec


def test_held_out_films_become_games(dataset):
    games = dataset.root / "games"
    test_films = dataset.meta["splits"]["test"]
    assert sorted(p.stem for p in games.glob("*.txt")) == sorted(test_films)
    for film_id in test_films:
        instructions = read_game_file(str(games / f"{film_id}.txt"))
        truth = [json.loads(line) for line in (games / f"{film_id}.jsonl").read_text().splitlines()]
        clips = dataset.films()[film_id]
        assert len(instructions) == len(truth) == len(clips)
        for instruction, turn, clip in zip(instructions, truth, clips, strict=True):
            assert turn["clip_id"] == clip.clip_id and turn["tags"] == clip.tags
            assert spec_from_instruction(instruction) == ShotSpec(**turn["spec"]) == _spec(clip)
            assert turn["blocking"] == clip.extra["blocking"] == "fixed"


def test_a_game_without_its_videos_redraws_them_with_their_blocking(dataset, tmp_path):
    from animegamer.eval.games import load_games

    film_id = dataset.meta["splits"]["test"][0]
    rows = [json.loads(line) for line in (dataset.root / "games" / f"{film_id}.jsonl").read_text().splitlines()]
    (tmp_path / "games").mkdir()
    for name in (f"{film_id}.txt", f"{film_id}.jsonl"):
        text = (dataset.root / "games" / name).read_text()
        (tmp_path / "games" / name).write_text(text)  # videos are relative to tmp_path now: missing
    game = load_games(tmp_path / "games")[0]
    drawn = game.clip_frames(1)
    spec = ShotSpec(**rows[1]["spec"])
    assert rows[1]["speed_jitter"] == dataset.meta["config"]["speed_jitter"] == 0.3
    assert np.array_equal(drawn, render_shot(spec, rows[1]["render_seed"], blocking="fixed", speed_jitter=0.3))
    assert not np.array_equal(drawn, render_shot(spec, rows[1]["render_seed"], blocking="free", speed_jitter=0.3))
    assert not np.array_equal(drawn, render_shot(spec, rows[1]["render_seed"], blocking="fixed"))

    # drawn at the data's size (its rows carry it); rows written before that draw at render_shot's defaults
    assert (rows[1]["num_frames"], rows[1]["height"], rows[1]["width"]) == (17, 64, 96) == drawn.shape[:3]
    for row in rows:
        row["num_frames"], row["width"] = 9, 48
    (tmp_path / "games" / f"{film_id}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    small = load_games(tmp_path / "games")[0].clip_frames(1)
    assert small.shape == (9, 64, 48, 3)
    assert np.array_equal(small, render_shot(spec, rows[1]["render_seed"], blocking="fixed", speed_jitter=0.3,
                                             num_frames=9, width=48))
    for row in rows:
        for key in ("num_frames", "height", "width"):
            del row[key]
    (tmp_path / "games" / f"{film_id}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert np.array_equal(load_games(tmp_path / "games")[0].clip_frames(1), drawn)


# -------------------------------------------------------------------------------- tag rules


def test_tags_follow_the_rules(dataset):
    for record in dataset.records:
        tags = parse_tags(record.tags)
        spec = _spec(record)
        v = tags.values
        assert record.caption_status == "ok"
        assert (tags.subject, tags.environment, tags.adverb) == (spec.character, f"{spec.time} {spec.place}",
                                                                 spec.adverb)
        assert v.motion_level == record.motion_level
        assert v.social == int(spec.action in ("talk", "play")) == int(bool(spec.friend))
        assert v.entertainment == int(spec.action in ("read", "dance", "play"))
        assert v.stamina == (1 if spec.action in ("eat", "sleep") else -1 if spec.action in
                             ("run", "jump", "fly", "dance") else 0)
        assert spec_from_instruction(parse_instruction(tags.instruction().render())) == spec


def test_world_is_big_enough():
    assert len(CHARACTERS) >= 3 and len(ACTIONS) >= 8 and len(PLACES) >= 5 and {"noon", "night"} <= set(TIMES)
    for action in ACTIONS.values():
        assert set(action.adverbs) <= set(ADVERB_SPEED) and set(action.places) <= set(PLACES)


# -------------------------------------------------------------------------------- motion


def test_motion_levels_follow_the_true_speed():
    sample = _sample()
    scopes = collections.defaultdict(list)
    for spec, scope in sample:
        scopes[spec.action].append(scope)
    mean = {a: float(np.mean(v)) for a, v in scopes.items()}
    assert mean["sleep"] < mean["eat"] < mean["walk"] < min(mean["run"], mean["fly"], mean["jump"])
    assert max(mean["read"], mean["talk"]) < mean["walk"]
    bins = fit_motion_bins([s for _, s in sample])
    levels = {a: np.mean([motion_level(s, bins) for s in v]) for a, v in scopes.items()}
    assert levels["sleep"] < levels["walk"] < min(levels["run"], levels["fly"])
    assert levels["sleep"] <= 1.5 and min(levels["run"], levels["fly"]) >= 4.0
    counts = collections.Counter(motion_level(s, bins) for _, s in sample)
    assert sorted(counts) == [1, 2, 3, 4, 5] and min(counts.values()) > 0.1 * len(sample)  # quantile bins


def test_adverbs_scale_the_speed():
    for action in ("walk", "run", "fly", "eat", "dance"):
        adverbs = ACTIONS[action].adverbs
        slow, fast = adverbs[0], adverbs[-1]
        mean = {a: np.mean([motion_scope(ShotSpec("Momo", action, "park", "noon", a), s) for s in range(6)])
                for a in (slow, fast)}
        assert mean[slow] < 0.85 * mean[fast], (action, mean)


def test_speed_jitter_is_speed_no_word_says():
    """The same spec (the same words) moves at spread-out speeds under a wide jitter, at nearly one speed under the
    default; the adverb still moves the mean. Bad jitters are refused."""
    spec = ShotSpec("Kai", "walk", "park", "noon", "happily")
    spread = {}
    for jitter in (0.1, 0.6):
        scopes = np.array([motion_scope(spec, seed, num_frames=9, speed_jitter=jitter) for seed in range(24)])
        spread[jitter] = scopes.max() / scopes.min()
    assert spread[0.1] < 1.3 < 2.5 < spread[0.6], spread
    mean = {a: np.mean([motion_scope(ShotSpec("Kai", "walk", "park", "noon", a), s, speed_jitter=0.6)
                        for s in range(24)]) for a in ("slowly", "quickly")}
    assert mean["slowly"] < 0.8 * mean["quickly"], mean
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="speed_jitter must be in"):
            animate(spec, 0, speed_jitter=bad)


def test_anchored_blocking_hides_the_speed_from_the_first_frame():
    """Fixed blocking starts a fast run further left than a slow one (the first frame tells the speed); anchored
    blocking starts every run and every flight from the same spot, and the speed shows only in how far it gets."""
    def first_and_last(blocking, action, adverb):
        rows = []
        for seed in range(6):
            scene = animate(ShotSpec("Kai", action, "park", "noon", adverb), seed, num_frames=9, blocking=blocking)
            hero = [pose for _, pose in (scene.frames[0].figures[0], scene.frames[-1].figures[0])]
            rows.append((hero[0].x, hero[1].x))
        return np.array(rows)

    for action in ("run", "fly"):
        slow = {b: first_and_last(b, action, "slowly") for b in ("fixed", "anchored")}
        fast = {b: first_and_last(b, action, "quickly") for b in ("fixed", "anchored")}
        start_gap = {b: abs(fast[b][:, 0].mean() - slow[b][:, 0].mean()) for b in slow}
        assert start_gap["anchored"] < 0.5 * start_gap["fixed"], (action, start_gap)
        assert start_gap["anchored"] < 2.0, (action, start_gap)  # pixels at 96 px wide
        travelled = {name: (rows[:, 1] - rows[:, 0]).mean() for name, rows in (("slow", slow["anchored"]),
                                                                                ("fast", fast["anchored"]))}
        assert travelled["fast"] > 1.3 * travelled["slow"] > 0, (action, travelled)


def test_levels_are_monotone_in_motion_scope(dataset):
    ordered = sorted(dataset.records, key=lambda r: r.motion_scope)
    levels = [r.motion_level for r in ordered]
    assert levels == sorted(levels) and levels[0] == 1 and levels[-1] == 5
    edges = dataset.meta["motion"]["edges"]
    assert all(motion_level(r.motion_scope, edges) == r.motion_level for r in dataset.records)


def test_pixels_move_like_the_true_motion():
    """The character's hair moves a lot when running and hardly at all when sleeping, as motion_scope says."""
    kai = CHARACTERS["Kai"]
    travel = {}
    for action in ("sleep", "read", "walk", "run"):
        spec = ShotSpec("Kai", action, "bedroom" if action in ("sleep", "read") else "street", "noon",
                        ACTIONS[action].adverbs[-1])
        mask = colour_mask(render_shot(spec, 1), kai.hair)
        assert mask.sum(axis=(1, 2)).min() > 5, action
        xs = [np.nonzero(m)[1].mean() for m in mask]
        travel[action] = np.abs(np.diff(xs)).mean()
    assert travel["sleep"] < 0.3 and travel["read"] < 0.5 < travel["walk"] < travel["run"]


def _hair_track(frames: np.ndarray, character: str) -> tuple[float, float]:
    """Horizontal start and mean per-frame step of a character's hair (its x centroid)."""
    xs = [np.nonzero(m)[1].mean() for m in colour_mask(frames, CHARACTERS[character].hair)]
    return xs[0], float(np.diff(xs).mean())


def test_fixed_blocking_stages_each_action_one_way():
    """Fixed blocking: every run crosses the middle left to right from nearly the same spot, whatever the seed;
    free blocking: either way, from anywhere. The speed (true motion) is the same under both."""
    spec = ShotSpec("Kai", "run", "street", "noon", "happily")
    tracks = {b: [_hair_track(render_shot(spec, seed, num_frames=9, blocking=b), "Kai") for seed in range(8)]
              for b in ("fixed", "free")}
    starts, steps = np.array(tracks["fixed"]).T
    assert (steps > 1.0).all() and np.ptp(starts) < 6, tracks["fixed"]
    starts, steps = np.array(tracks["free"]).T
    assert (steps > 1.0).any() and (steps < -1.0).any() and np.ptp(starts) > 15, tracks["free"]
    scopes = {b: [motion_scope(spec, seed, num_frames=9, blocking=b) for seed in range(8)] for b in ("fixed", "free")}
    assert np.mean(scopes["fixed"]) == pytest.approx(np.mean(scopes["free"]), rel=0.15)
    pair = animate(ShotSpec("Luna", "talk", "park", "noon", "happily", friend="Kai"), 3, blocking="fixed")
    hero, friend = (pose.x for _, pose in pair.frames[0].figures)
    assert hero > friend  # the hero stands on the right of a pair
    with pytest.raises(ValueError, match="blocking 'staged' is not one of"):
        animate(spec, 0, blocking="staged")
    with pytest.raises(Exception, match="blocking='staged' is not one of"):
        load_config(ROOT / "configs/spriteworld/data.yaml", ["blocking=staged"])


# -------------------------------------------------------------------------------- continuity


def _place_returns(places: list[str]) -> bool:
    """Some place is left for another and later visited again."""
    return any(places[i] != places[i - 1] and places[i] in places[: i - 1] for i in range(2, len(places)))


def test_films_have_continuity():
    films = plan_films(2, 40, 12, list(CHARACTERS), 0.2)
    pairs = [(a, b) for f in films for a, b in zip(f.shots[:-1], f.shots[1:], strict=True)]
    same_place = np.mean([a.place == b.place for a, b in pairs])
    assert same_place > 0.5  # chance would be about 1/6
    for a, b in pairs:
        # the chain's successions, plus going to bed whenever night has come
        assert TRANSITIONS[a.action].get(b.action, 0) > 0 or (b.action, b.time) == ("sleep", "night"), (a, b)
        ta, tb = TIMES.index(a.time), TIMES.index(b.time)
        assert tb in (ta, ta + 1) or (a.action == "sleep" and a.time == "night" and b.time == "morning")
        assert a.character == b.character
    shots = [s for f in films for s in f.shots]
    night = np.mean([s.action == "sleep" for s in shots if s.time == "night"])
    day = np.mean([s.action == "sleep" for s in shots if s.time != "night"])
    assert night > 3 * day
    returning = [f for f in films if _place_returns([s.place for s in f.shots])]
    assert len(returning) > len(films) / 2  # places come back after the character has been elsewhere
    assert {s.place for s in shots} == set(PLACES) and {s.action for s in shots} == set(ACTIONS)
    assert {s.character for s in shots} == set(CHARACTERS)


def test_split_is_by_film_and_deterministic():
    a = plan_films(0, 10, 3, ["Qiqi", "Luna"], 0.3)
    b = plan_films(0, 10, 3, ["Qiqi", "Luna"], 0.3)
    assert [(f.film_id, f.split, f.shots, f.seeds) for f in a] == [(f.film_id, f.split, f.shots, f.seeds) for f in b]
    assert sum(f.split == "test" for f in a) == 3
    assert {f.shots[0].character for f in a} == {"Qiqi", "Luna"}


# -------------------------------------------------------------------------------- pictures


def test_characters_are_recognisable_by_colour():
    for name, ch in CHARACTERS.items():
        frames = render_shot(ShotSpec(name, "walk", "kitchen", "noon", "slowly"), 0)
        own = colour_mask(frames, ch.top).sum() / len(frames)
        assert own > 15, name
        for other, och in CHARACTERS.items():
            if other != name:
                assert colour_mask(frames, och.top).sum() / len(frames) < own / 5, (name, other)


def test_night_is_darker_than_day_and_places_differ():
    for place in PLACES:
        day = background(place, "noon", 64, 96).astype(np.float64)
        night = background(place, "night", 64, 96).astype(np.float64)
        assert night.mean() < 0.6 * day.mean(), place
    for a in PLACES:
        for b in PLACES:
            if a < b:
                assert np.abs(background(a, "noon", 64, 96).astype(int) - background(b, "noon", 64, 96)).mean() > 20


def test_two_characters_in_social_shots():
    frames = render_shot(ShotSpec("Qiqi", "talk", "park", "noon", "happily", friend="Momo"), 0)
    for ch in ("Qiqi", "Momo"):
        assert colour_mask(frames, CHARACTERS[ch].top).sum(axis=(1, 2)).min() > 5
    scene = animate(ShotSpec("Luna", "play", "beach", "noon", "happily", friend="Kai"), 0)
    assert all(len(f.figures) == 2 and f.props[0][0] == "ball" for f in scene.frames)


# -------------------------------------------------------------------------------- errors, game file, script


def test_tiny_t5_tokenizer_keeps_the_place_at_fixed_positions(tmp_path):
    """Trained with the world's lexicon, every SpriteWorld word is one token, so the background's two words sit at
    positions set by the action alone (the shot tokens the MLLM predicts are T5 tokens, position by position)."""
    from transformers import AutoTokenizer

    from animegamer.tiny import build_tiny_t5, corpus_lines

    assert corpus_lines(words=()) == corpus_lines()  # the tiny checkpoints of tests and make demo do not change
    build_tiny_t5(tmp_path, words=lexicon())
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"))
    for word in lexicon():
        assert tokenizer.tokenize(word) == [f"\u2581{word}"], word
    place_at = collections.defaultdict(set)
    for (name, action), place, time in zip(
        [(c, a) for c in CHARACTERS for a in ACTIONS], PLACES * 20, TIMES * 30, strict=False
    ):
        if place not in ACTIONS[action].places:
            continue
        friend = next(c for c in CHARACTERS if c != name) if ACTIONS[action].social else ""
        spec = ShotSpec(name, action, place, time, ACTIONS[action].adverbs[-1], friend)
        pieces = tokenizer.tokenize(spec.instruction().render())
        place_at[action].add(pieces.index(f"\u2581{place}"))
    assert all(len(positions) == 1 for positions in place_at.values()), place_at
    assert len(place_at) >= 8


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(character="Nobody", action="walk", place="park", time="noon", adverb="slowly"), "character"),
        (dict(character="Qiqi", action="swim", place="park", time="noon", adverb="slowly"), "action"),
        (dict(character="Qiqi", action="talk", place="park", time="noon", adverb="calmly"), "friend"),
        (dict(character="Qiqi", action="walk", place="park", time="noon", adverb="slowly", friend="Kai"), "friend"),
    ],
)
def test_bad_specs_are_rejected(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ShotSpec(**kwargs)


@pytest.mark.parametrize(
    "line, field",
    [
        ("Character: Zed; Motion: slowly walk; Background: noon park.", "character"),
        ("Character: Qiqi; Motion: slowly walk; Background: noon moon.", "background"),
        ("Character: Qiqi; Motion: walk; Background: noon park.", "motion"),
        ("Character: Qiqi; Motion: slowly swim; Background: noon park.", "motion"),
        ("Character: Qiqi; Motion: calmly talk with Qiqi; Background: noon park.", "motion"),
        ("Qiqi walks in the park", "format"),
    ],
)
def test_instructions_outside_the_world_are_rejected(line, field):
    with pytest.raises(TagError) as info:
        spec_from_instruction(parse_instruction(line), source="game.txt", line=3)
    assert info.value.field == field and "game.txt:3" in str(info.value)


def test_demo_game_is_in_the_world():
    from animegamer.spriteworld.memory import resolve_game

    instructions = read_game_file(str(ROOT / "game_demo" / "spriteworld.txt"))
    specs = resolve_game(instructions)  # the memory world's words (still, here, home ...) resolved by earlier turns
    assert len(specs) == 8 and len({s.action for s in specs}) >= 7 and len({s.place for s in specs}) >= 5
    assert {s.time for s in specs} >= {"morning", "night"} and any(s.friend for s in specs)
    said = {word for i in instructions for word in (*i.background.split(), *i.motion.split())}
    assert {"still", "here", "back", "home", "friend"} <= said  # it exercises the shipped memory world
    assert specs[5].place == specs[2].place == "park" and specs[5].friend == "Momo"  # back: two turns back


def test_config_and_script(tmp_path):
    cfg = load_config(ROOT / "configs" / "spriteworld" / "data.yaml")
    assert isinstance(cfg, SpriteWorldConfig) and (cfg.height, cfg.width, cfg.num_frames, cfg.fps) == (64, 96, 9, 8)
    # every step of the chain reads and draws clips of the data's size
    for name in ("pretrain", "stage_a", "stage_c"):
        step = load_config(ROOT / "configs" / "spriteworld" / f"{name}.yaml").data
        assert (step.height, step.width, step.num_frames, step.fps) == (64, 96, 9, 8), name
    sampling = [load_config(ROOT / "configs" / "spriteworld" / "inference.yaml").sampling,
                load_config(ROOT / "configs" / "spriteworld" / "eval.yaml").inference.sampling]
    assert all((s.height, s.width, s.num_frames) == (64, 96, 9) for s in sampling)
    assert cfg.output_dir == "outputs/spriteworld/data"
    script = [sys.executable, str(ROOT / "scripts" / "spriteworld" / "make.py"),
              "--config", str(ROOT / "configs" / "spriteworld" / "data.yaml")]
    out = subprocess.run(script + [f"output_dir={tmp_path}", "num_films=2", "shots_per_film=2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "wrote 4 clips from 2 films (1 train, 1 test)" in out.stdout
    assert len(read_manifest(tmp_path / "clips.jsonl")) == 4
    bad = subprocess.run(script + [f"output_dir={tmp_path}", "characters=[Nobody]"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode != 0 and "Nobody" in bad.stderr
