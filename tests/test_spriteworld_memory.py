"""SpriteWorld's memory world: film facts persist in the drawn pictures, instructions leave out what history fixes
and still resolve, held-out pairs stay out of the training films, records and games round-trip."""

import json

import numpy as np
import pytest

from animegamer.data.manifest import read_manifest
from animegamer.spriteworld import CHARACTERS, ShotSpec, caption_tags, plan_films, render_shot, write_dataset
from animegamer.spriteworld.home import FLOOR_NAMES, FLOORS, WALL_NAMES, WALLS, HomeLook, home_background
from animegamer.spriteworld.memory import (
    COME_BACK,
    FOLLOW_SHOTS,
    MEMORY_WORDS,
    GameMemory,
    HeldOutPairs,
    caption_text,
    film_memory,
    lexicon,
    resolve_game,
)
from animegamer.states import TagError, parse_instruction, parse_tags, read_game_file
from tests.helpers.spriteworld import SPEC_KEYS, colour_mask, small_config

pytestmark = pytest.mark.slow  # an end-to-end run: `make test-fast` leaves it out

HELD_OUT = ["Momo:fly", "Kai:read", "Qiqi:Luna"]
WALL_POINT = (6, 8)  # (x, y) on the 96x64 design grid: bare wall in the bedroom and the kitchen


@pytest.fixture(scope="module")
def memory_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory")
    cfg = small_config(out, num_films=8, shots_per_film=10, test_fraction=0.25, memory=True, back=True,
                       held_out_pairs=HELD_OUT, num_frames=9, height=48, width=72, workers=1)
    return read_manifest(write_dataset(cfg, progress=False))


def _wall_pixel(frames: np.ndarray, mirrored: bool) -> np.ndarray:
    h, w = frames.shape[1:3]
    x, y = WALL_POINT
    col = round(x * w / 96) if not mirrored else w - 1 - round(x * w / 96)
    return frames[0, round(y * h / 64), col].astype(int)


def test_the_home_introduced_once_is_drawn_in_every_later_indoor_shot(memory_data):
    checked = 0
    for film_id, records in memory_data.films().items():
        indoor = [r for r in records if r.extra["place"] in ("bedroom", "kitchen")]
        looks = {tuple(r.extra["home"]) for r in indoor}
        assert len(looks) <= 1, film_id  # one home per film, never changed
        assert all(r.extra["home"] is None for r in records if r not in indoor)
        for r in indoor:
            look = HomeLook.from_value(r.extra["home"])
            frames = render_shot(ShotSpec(**{k: r.extra[k] for k in SPEC_KEYS}), r.extra["render_seed"],
                                 blocking=r.extra["blocking"], speed_jitter=r.extra["speed_jitter"], num_frames=9,
                                 height=48, width=72, home=r.extra["home"], companion=r.extra["companion"])
            own = home_background(r.extra["place"], r.extra["time"], 48, 72, look)
            other = home_background(r.extra["place"], r.extra["time"], 48, 72,
                                    HomeLook((look.wall + 1) % len(WALLS), look.floor, look.mirrored))
            pixel = _wall_pixel(frames, look.mirrored)
            assert np.array_equal(pixel, _wall_pixel(own[None], look.mirrored))
            assert np.abs(pixel - _wall_pixel(other[None], look.mirrored)).max() > 10
            checked += 1
    assert checked >= 4


def test_a_home_look_recolours_and_mirrors_the_room():
    default = home_background("bedroom", "noon", 64, 96, None)
    mint = home_background("bedroom", "noon", 64, 96, HomeLook(1, 2, False))
    mirrored = home_background("bedroom", "noon", 64, 96, HomeLook(1, 2, True))
    assert np.array_equal(mirrored, mint[:, ::-1])
    assert np.abs(default.astype(int) - mint).mean() > 10
    assert tuple(mint[8, 6]) == WALLS[1] and tuple(mint[60, 30]) == FLOORS[2]  # noon light is white
    assert np.array_equal(home_background("park", "noon", 64, 96, HomeLook(1, 2, True)),
                          home_background("park", "noon", 64, 96, None))  # outdoors has no home
    with pytest.raises(ValueError, match="palettes"):
        HomeLook(len(WALLS), 0, False)


def test_the_companion_follows_after_a_social_shot_until_sleep():
    rng = np.random.default_rng(0)
    shots = [ShotSpec("Qiqi", "talk", "park", "noon", "happily", friend="Kai"),
             ShotSpec("Qiqi", "walk", "park", "noon", "slowly"), ShotSpec("Qiqi", "run", "park", "noon", "quickly"),
             ShotSpec("Qiqi", "walk", "street", "evening", "slowly"),
             ShotSpec("Qiqi", "play", "park", "evening", "happily", friend="Kai"),
             ShotSpec("Qiqi", "sleep", "park", "night", "soundly"), ShotSpec("Qiqi", "eat", "park", "night", "slowly")]
    memory = film_memory(rng, shots, "Kai", HeldOutPairs())
    assert [m.companion for m in memory] == ["", "Kai", "Kai", "", "", "", ""]
    assert FOLLOW_SHOTS == 2
    assert [m.depends for m in memory][:3] == ["full", "history", "history"]
    # the companion was last in view the turn before; the friend said as "friend" at turn 4 was last seen at turn 2
    assert [m.reach for m in memory][:3] == [0, 1, 1]
    assert memory[4].reach in (0, 1, 2) and (memory[4].friend_word != "friend" or memory[4].reach >= 2)
    # drawn: Kai's shirt shows at the right edge of the walk with a companion, not without
    walk = shots[1]
    alone, followed = render_shot(walk, 0, num_frames=5), render_shot(walk, 0, num_frames=5, companion="Kai")
    right = slice(72, 96)
    assert colour_mask(followed[:, :, right], CHARACTERS["Kai"].top).sum() > 20
    assert colour_mask(alone[:, :, right], CHARACTERS["Kai"].top).sum() == 0
    with pytest.raises(ValueError, match="companion"):
        render_shot(walk, 0, companion="Qiqi")


def test_instructions_leave_out_what_history_fixes_and_still_resolve(memory_data):
    words = set()
    for film_id in memory_data.meta["splits"]["test"]:
        games = memory_data.root / "games"
        rows = [json.loads(line) for line in (games / f"{film_id}.jsonl").read_text().splitlines()]
        instructions = read_game_file(str(games / f"{film_id}.txt"))  # the house grammar parses them
        assert [ShotSpec(**row["spec"]) for row in rows] == resolve_game(instructions)
        for instruction, row in zip(instructions, rows, strict=True):
            said = set(instruction.background.split()) | set(instruction.motion.split())
            omitted = said & set(MEMORY_WORDS)
            words |= omitted
            assert row["depends"] in ("full", "history", "new")
            if omitted:
                assert row["depends"] == "history"
            if omitted - {"home"} or row["companion"]:  # "home" names the bedroom; only its look is never said
                assert row["reach"] >= 1
            if "back" in omitted:
                assert row["reach"] >= 2  # the turn before is elsewhere
            if row["depends"] != "history":
                assert row["reach"] == 0
            assert parse_tags(row["tags"]).instruction() == instruction
        assert rows[0]["depends"] in ("full", "new")  # the first turn says everything
    assert {"still", "here", "back"} <= words


def test_the_decoder_caption_says_every_word_the_instruction_leaves_out(memory_data):
    """The base model and stage (a) learn from the clip's full caption; only the MLLM reads the typed words."""
    shortened = 0
    for record in memory_data.records:
        full, typed = caption_tags(record), record.shot_tags()
        spec = ShotSpec(**{k: record.extra[k] for k in SPEC_KEYS})
        assert full == spec.tags(typed.values.motion_level)
        assert not set(full.environment.split()) & set(MEMORY_WORDS)
        assert full.values == typed.values and full.subject == typed.subject
        shortened += full != typed
        if set(typed.environment.split()) & set(MEMORY_WORDS) or "friend" in typed.motion.split():
            assert full != typed
        else:
            assert full == typed
    assert shortened > 0


def test_the_caption_names_the_home_and_companion_the_clip_shows(memory_data, tmp_path):
    """What no instruction says but the clip shows (the home's look, the companion) is in the decoder's caption, as
    one-piece words of the tiny T5 within its 48 tokens; the held-out games carry each turn's caption."""
    from transformers import AutoTokenizer

    from animegamer.eval.games import load_games
    from animegamer.spriteworld import lexicon
    from animegamer.tiny import build_tiny_t5

    homes = companions = 0
    for record in memory_data.records:
        text, home = caption_text(record), HomeLook.from_value(record.extra["home"])
        assert text.startswith(caption_tags(record).motion_text())
        if home is None:
            assert "Home:" not in text
        else:
            homes += 1
            layout = "mirrored" if home.mirrored else "designed"
            assert f"Home: {WALL_NAMES[home.wall]} walls, {FLOOR_NAMES[home.floor]} floor, {layout} layout." in text
        companion = record.extra["companion"]
        assert (f"Companion: {companion}." in text) == bool(companion)
        companions += bool(companion)
    assert homes > 0 and companions > 0
    build_tiny_t5(tmp_path / "t5", words=lexicon())
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "t5" / "tokenizer"))
    longest = max(len(tokenizer(caption_text(r)).input_ids) for r in memory_data.records)
    assert 20 < longest <= 48  # configs/spriteworld: text_tokens 48 (nothing cut)
    for game in load_games(memory_data.root / "games"):
        clips = {r.clip_id: r for r in memory_data.records}
        rows = [json.loads(line) for line in game.path.read_text().splitlines()]
        assert [game.caption(t) for t in range(len(rows))] == [caption_text(clips[r["clip_id"]]) for r in rows]


def test_a_plain_world_caption_is_its_tag_line(tmp_path):
    cfg = small_config(tmp_path, num_films=2, shots_per_film=4, test_fraction=0.5, num_frames=5, workers=1)
    manifest = read_manifest(write_dataset(cfg, progress=False))
    assert [caption_text(r) for r in manifest.records] == [r.shot_tags().motion_text() for r in manifest.records]


def test_a_word_that_refers_to_nothing_is_a_clear_error():
    memory = GameMemory()
    with pytest.raises(TagError, match="earlier turn"):
        memory.resolve(parse_instruction("Character: Kai; Motion: slowly walk; Background: still here."))
    def play(motion: str, background: str) -> ShotSpec:
        return memory.resolve(parse_instruction(f"Character: Kai; Motion: {motion}; Background: {background}."))

    assert play("slowly walk", "noon park").place == "park"
    later = play("happily talk with Luna", "later here")
    assert (later.time, later.place, later.friend) == ("evening", "park", "Luna")
    again = play("calmly talk with friend", "still street")
    assert again.friend == "Luna" and again.time == "evening"
    with pytest.raises(TagError, match="earlier turn"):
        memory.resolve(parse_instruction("Character: Kai; Motion: slowly walk; Background: night home."))


def test_held_out_pairs_never_occur_in_training_films():
    held = HeldOutPairs.parse(HELD_OUT)
    films = plan_films(3, 48, 12, list(CHARACTERS), 0.25, held)
    seen_test = set()
    for film in films:
        for shot in film.shots:
            pairs = {(shot.character, shot.action)} | ({(shot.character, shot.friend)} if shot.friend else set())
            pairs |= {(shot.character, film.friend)}  # the film's friend may follow in any shot
            bad = {p for p in pairs if p in held.actions or frozenset(p) in held.friends}
            if film.split == "train":
                assert not bad, (film.film_id, bad)
            else:
                seen_test |= {(a, b) if (a, b) in held.actions else frozenset((a, b)) for a, b in bad}
    assert seen_test == set(held.actions) | set(held.friends)  # and every one of them is in a held-out game
    with pytest.raises(ValueError, match="held_out_pairs"):
        HeldOutPairs.parse(["Momo:swim"])


def test_memory_changes_no_shot_of_the_plan_and_records_round_trip(memory_data, tmp_path):
    from animegamer.eval.games import load_games

    plain = plan_films(0, 8, 10, list(CHARACTERS), 0.25, HeldOutPairs.parse(HELD_OUT), COME_BACK)
    records = memory_data.films()
    for film in plain:
        assert [ShotSpec(**{k: r.extra[k] for k in SPEC_KEYS}) for r in records[film.film_id]] == film.shots
    # a held-out game whose videos are missing is drawn again with its home and companion
    film_id = memory_data.meta["splits"]["test"][0]
    (tmp_path / "games").mkdir()
    for name in (f"{film_id}.txt", f"{film_id}.jsonl"):
        (tmp_path / "games" / name).write_text((memory_data.root / "games" / name).read_text())
    game = load_games(tmp_path / "games")[0]
    rows = [json.loads(line) for line in (tmp_path / "games" / f"{film_id}.jsonl").read_text().splitlines()]
    assert [m["depends"] for m in game.marks] == [r["depends"] for r in rows]
    for turn, row in enumerate(rows):
        expected = render_shot(ShotSpec(**row["spec"]), row["render_seed"], blocking=row["blocking"],
                               speed_jitter=row["speed_jitter"], num_frames=9, height=48, width=72,
                               home=row.get("home"), companion=row.get("companion", ""))
        assert np.array_equal(game.clip_frames(turn), expected)


def test_training_tags_are_the_training_records_tag_lines(memory_data):
    import dataclasses

    from animegamer.config import SpriteWorldConfig
    from animegamer.spriteworld import training_tags

    cfg = SpriteWorldConfig(**{k: v for k, v in memory_data.meta["config"].items()})
    train = set(memory_data.meta["splits"]["train"])
    recorded = [r.shot_tags() for r in memory_data.records if r.film_id in train]
    expected = [dataclasses.replace(t, values=dataclasses.replace(t.values, motion_level=1)) for t in recorded]
    assert training_tags(cfg) == expected
    assert any("here" in t.environment for t in expected)


def test_every_real_clip_of_the_held_out_games_shows_its_cast(memory_data):
    """The identity columns' detector on the world's own clips: the hero and the friend in view are always found."""
    from animegamer.eval.games import load_games

    friends = {"friend_named": 0, "friend_remembered": 0}
    for game in load_games(memory_data.root / "games"):
        for turn in range(len(game)):
            values = game.cast(turn).score(game.clip_frames(turn))
            assert all(v == 1.0 for v in values.values()), (game.game_id, turn, values)
            for key in friends.keys() & values.keys():
                friends[key] += 1
    assert friends["friend_remembered"] > 0  # the memory world has friends no instruction names


def _trips_back(films) -> tuple[int, int]:
    """(shots returning to the place before the one just left, shots after the first) of ``films``."""
    back = total = 0
    for film in films:
        places, previous = [s.place for s in film.shots], ""
        for t in range(1, len(places)):
            total += 1
            if places[t] != places[t - 1]:
                back += places[t] == previous
                previous = places[t - 1]
    return back, total


def test_back_names_the_place_before_this_one_and_needs_two_turns_of_history():
    shots = [ShotSpec("Kai", "walk", "park", "noon", "calmly"), ShotSpec("Kai", "run", "park", "noon", "quickly"),
             ShotSpec("Kai", "eat", "kitchen", "noon", "happily"), ShotSpec("Kai", "walk", "park", "noon", "slowly"),
             ShotSpec("Kai", "walk", "street", "noon", "slowly"), ShotSpec("Kai", "run", "street", "noon", "happily"),
             ShotSpec("Kai", "jump", "park", "noon", "gently")]
    said = {}
    for seed in range(40):  # the words are drawn; every seed must resolve, and some say "back"
        memory = film_memory(np.random.default_rng(seed), shots, "Luna", HeldOutPairs())
        for t, m in enumerate(memory):
            if m.place_word == "back":
                said[t] = m.reach
        typed = [m.tags(shot, 1).instruction() for m, shot in zip(memory, shots, strict=True)]
        assert resolve_game(typed) == shots
    assert said == {3: 2, 6: 3}  # park -> kitchen -> back (park, 2 turns back); street twice -> back (park, 3)
    game = GameMemory()
    game.resolve(parse_instruction("Character: Kai; Motion: calmly walk; Background: noon park."))
    with pytest.raises(TagError, match="'back' refers to an earlier turn"):
        GameMemory().resolve(parse_instruction("Character: Kai; Motion: calmly walk; Background: noon back."))
    with pytest.raises(TagError, match="'back' refers to an earlier turn"):  # no other place yet
        game.resolve(parse_instruction("Character: Kai; Motion: calmly walk; Background: still back."))
    game.resolve(parse_instruction("Character: Kai; Motion: happily eat; Background: still kitchen."))
    game.resolve(parse_instruction("Character: Kai; Motion: happily eat; Background: still here."))
    spec = game.resolve(parse_instruction("Character: Kai; Motion: calmly walk; Background: later back."))
    assert (spec.place, spec.time) == ("park", "evening")


def test_back_is_opt_in_and_off_leaves_the_memory_world_as_it_was(tmp_path):
    """memory=true without back: no film says "back" and the plans are the world's own (no extra trips); with
    back the plans change and "back" is said; every other word is drawn the same way either way."""
    from animegamer.spriteworld.films import plan_world

    kw = dict(num_films=12, shots_per_film=10, test_fraction=0.25, memory=True, held_out_pairs=HELD_OUT)
    films, memories = plan_world(small_config(tmp_path, **kw))
    assert [f.shots for f in films] == [f.shots for f in plan_films(0, 12, 10, list(CHARACTERS), 0.25,
                                                                    HeldOutPairs.parse(HELD_OUT))]
    assert not any(m.place_word == "back" for ms in memories.values() for m in ms)
    assert "back" not in lexicon() and lexicon(back=True) == [*lexicon()[:lexicon().index("home")], "back",
                                                              *lexicon()[lexicon().index("home"):]]
    films_back, memories_back = plan_world(small_config(tmp_path, back=True, **kw))
    assert [f.shots for f in films_back] != [f.shots for f in films]
    assert sum(m.place_word == "back" for ms in memories_back.values() for m in ms) >= 10
    for film in films:  # the same plan with back on: only "back" replaces what was said
        on = film_memory(np.random.default_rng(7), film.shots, film.friend, HeldOutPairs(), True, True)
        off = film_memory(np.random.default_rng(7), film.shots, film.friend, HeldOutPairs(), True, False)
        for a, b in zip(on, off, strict=True):
            assert a.time_word == b.time_word and a.friend_word == b.friend_word
            assert a.place_word == b.place_word or a.place_word == "back"


def test_memory_films_make_trips_out_and_back_likelier_and_without_it_the_plan_is_unchanged():
    held = HeldOutPairs.parse(HELD_OUT)
    plain = plan_films(3, 24, 12, list(CHARACTERS), 0.25, held)
    assert plain == plan_films(3, 24, 12, list(CHARACTERS), 0.25, held, 0.0)  # the default is no change
    back, total = _trips_back(plan_films(3, 24, 12, list(CHARACTERS), 0.25, held, COME_BACK))
    back_plain, _ = _trips_back(plain)
    assert back > 1.5 * back_plain and back > 0.15 * total, (back, back_plain, total)
