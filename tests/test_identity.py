"""Who is drawn: the identity columns of the evaluation (animegamer.spriteworld.identity), on clips drawn with the
world's own drawing code, and the bootstrap interval machinery on those columns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from animegamer.eval.games import GroundTruthGame
from animegamer.eval.intervals import difference_rows, interval_markdown, interval_rows
from animegamer.eval.metrics import MetricRecord, summarize
from animegamer.eval.report import markdown_table
from animegamer.spriteworld import ShotSpec, render_shot
from animegamer.spriteworld.identity import TurnCast, hero_on_screen, second_character
from animegamer.states import parse_tags

NAMED = "Character: Qiqi; Motion: happily talk with Luna; Background: noon park."
UNNAMED = "Character: Qiqi; Motion: happily talk with friend; Background: noon park."


def _spec(**kw) -> dict:
    return {"character": "Qiqi", "action": "talk", "place": "park", "time": "noon", "adverb": "happily",
            "friend": "Luna", **kw}


def _clip(spec: dict, **drawing) -> np.ndarray:
    return render_shot(ShotSpec(**spec), 5, num_frames=6, **drawing)


def test_the_right_friend_scores_one_the_wrong_or_none_zero():
    named = TurnCast.from_row(_spec(), {}, NAMED)
    assert named.named and named.friend == "Luna" and named.hero == "Qiqi"
    assert named.score(_clip(_spec())) == {"hero_on_screen": 1.0, "friend_named": 1.0}
    assert named.score(_clip(_spec(friend="Kai"))) == {"hero_on_screen": 1.0, "friend_named": 0.0}  # wrong friend
    alone = _clip(_spec(action="walk", adverb="slowly", friend=""))
    assert named.score(alone) == {"hero_on_screen": 1.0, "friend_named": 0.0}  # no friend at all
    empty = np.repeat(named.scenery[None], 4, axis=0)  # the place without anyone in it
    assert named.score(empty) == {"hero_on_screen": 0.0, "friend_named": 0.0}
    # the same shot, the friend only said as "friend": scored in the remembered column
    remembered = TurnCast.from_row(_spec(), {}, UNNAMED)
    assert not remembered.named and remembered.score(_clip(_spec())) == {"hero_on_screen": 1.0,
                                                                       "friend_remembered": 1.0}


def test_every_friend_and_place_is_told_apart():
    for place, time in (("park", "noon"), ("beach", "evening"), ("kitchen", "morning"), ("street", "night")):
        for hero, friend in (("Qiqi", "Momo"), ("Momo", "Kai"), ("Kai", "Luna"), ("Luna", "Qiqi")):
            spec = _spec(character=hero, friend=friend, place=place, time=time)
            cast = TurnCast.from_row(spec, {}, "")
            frames = _clip(spec)
            assert second_character(frames, hero, cast.scenery) == friend
            assert hero_on_screen(frames, hero, cast.scenery)
            assert not hero_on_screen(frames, next(n for n in ("Qiqi", "Momo", "Kai", "Luna")
                                                   if n not in (hero, friend)), cast.scenery)


def test_a_companion_a_home_a_sleeper_and_another_frame_size():
    # the memory world's companion: a walk the instruction says nothing of a friend in, Kai following
    spec, settings = _spec(action="walk", adverb="slowly", friend=""), {"companion": "Kai", "home": [1, 2, True]}
    cast = TurnCast.from_row(spec, settings, "Character: Qiqi; Motion: slowly walk; Background: noon park.")
    assert cast.friend == "Kai" and not cast.named
    frames = _clip(spec, companion="Kai")
    assert cast.score(frames) == {"hero_on_screen": 1.0, "friend_remembered": 1.0}
    assert cast.score(_clip(spec, companion="Luna"))["friend_remembered"] == 0.0
    # asleep in the film's bedroom: the shirt is under the blanket, the hero still counts as drawn
    sleep = _spec(action="sleep", place="bedroom", adverb="soundly", friend="", character="Momo")
    asleep = TurnCast.from_row(sleep, {"home": [2, 0, False]}, "")
    assert asleep.under_blanket
    assert asleep.score(_clip(sleep, home=[2, 0, False])) == {"hero_on_screen": 1.0}
    # a clip rendered at another size is read against its scenery resized alike
    import cv2

    big = np.stack([cv2.resize(f, (192, 128), interpolation=cv2.INTER_NEAREST) for f in _clip(_spec())])
    assert TurnCast.from_row(_spec(), {}, NAMED).score(big)["friend_named"] == 1.0


def test_bad_inputs_raise():
    cast = TurnCast.from_row(_spec(), {}, NAMED)
    with pytest.raises(ValueError, match="frames must be"):
        cast.score(np.zeros((64, 96, 3), np.uint8))
    with pytest.raises(ValueError, match="not one of"):
        second_character(_clip(_spec()), "Nobody", cast.scenery)
    with pytest.raises(ValueError, match="not characters of the world"):
        TurnCast.from_row(_spec(friend="Qiqi"), {}, "")


def test_a_games_turn_knows_its_cast():
    tags = parse_tags("<S>Qiqi</S><MD>talk with friend</MD><EV>noon park</EV><ML>2</ML><MA>happily</MA>"
                      "<SC>1</SC><ET>0</ET><ST>0</ST>")
    game = GroundTruthGame("g", "Qiqi", (tags,), Path("g.jsonl"), ({"spec": _spec(), "render_seed": 5},))
    cast = game.cast(0)
    assert cast is not None and cast.friend == "Luna" and not cast.named  # "friend": remembered
    assert GroundTruthGame("g", "Qiqi", (tags,), Path("g.jsonl"), ({"video": "x.mp4"},)).cast(0) is None


def _records(system: str, right: dict[str, list[float]]) -> list[MetricRecord]:
    """One record per turn of each game: a friend turn's 0/1 value and the hero on screen."""
    return [MetricRecord(system, game, turn, {"friend_remembered": value, "hero_on_screen": 1.0})
            for game, values in right.items() for turn, value in enumerate(values)]


def test_identity_columns_get_bootstrap_intervals_and_paired_differences():
    games = {f"g{i}": [float(t % (2 + i % 3) != 0) for t in range(6)] for i in range(8)}
    worse = {g: [0.0 if t % 2 else v for t, v in enumerate(values)] for g, values in games.items()}
    records = {"full game": _records("full game", games), "text only": _records("text only", worse)}
    splits = {(g, t): ("all",) for g in games for t in range(6)}
    rows = interval_rows(records, splits) + difference_rows("full game", records, splits)
    cell = {(r["system"], r["metric"]): r for r in rows}
    mine = cell[("full game", "friend_remembered")]
    flat = [v for values in games.values() for v in values]
    assert mine["mean"] == pytest.approx(np.mean(flat)) and mine["turns"] == 48 and mine["games"] == 8
    assert 0.0 <= mine["lower"] < mine["mean"] < mine["upper"] <= 1.0
    diff = cell[("full game − text only", "friend_remembered")]
    assert diff["mean"] > 0 and diff["lower"] > 0  # the paired difference clears zero
    hero = cell[("full game", "hero_on_screen")]
    assert hero["mean"] == hero["lower"] == hero["upper"] == 1.0
    assert ("full game", "friend_named") not in cell  # no named turn: no cell
    md = interval_markdown(rows)
    assert "Friend-R ↑" in md and "Hero ↑" in md and "Friend-N" not in md
    table = markdown_table([(name, summarize(rs)) for name, rs in records.items()])
    assert "| Friend-N ↑ | Friend-R ↑ | Hero ↑ |" in table
    plain = [MetricRecord("x", "g", 0, {"clip_t": 0.2})]
    assert "Friend" not in markdown_table([("x", summarize(plain))])  # not a SpriteWorld game: no such columns
    assert math.isclose(summarize(records["text only"]).means["friend_remembered"], np.mean(
        [v for values in worse.values() for v in values]))



def test_identity_probes_read_a_linear_signal_and_not_noise():
    from importlib import import_module

    probes = import_module("research.spriteworld.identity_probes")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 160)  # (S,)
    games = [f"g{i % 20}" for i in range(160)]
    signal = np.eye(4)[labels] @ rng.normal(size=(4, 50)) + 0.3 * rng.normal(size=(160, 50))  # (S, 50)
    read = probes.probe_accuracy(signal, labels, games, 4, 5, 1e-2)
    assert read["accuracy"] > 0.9 and read["interval"][0] <= read["accuracy"] <= read["interval"][1]
    assert read["turns"] == 160 and read["games"] == 20 and read["features"] == 50
    noise = probes.probe_accuracy(rng.normal(size=(160, 50)), labels, games, 4, 5, 1e-2)
    assert noise["accuracy"] < 0.45  # chance is about 1/4
    caption = "Character: Qiqi; Motion: happily walk; Background: noon park. Companion: Kai."
    assert probes.without_friend(caption, "Kai") == "Character: Qiqi; Motion: happily walk; Background: noon park."
    assert probes.without_friend("talk with Kai.", "Kai") == "talk with friend."


def test_swap_shots_redraw_the_first_frame_with_the_new_friend_and_name_the_swap():
    """research/spriteworld/swap_shots.py: the first frame drawn again with the swapped-in friend (social friend
    or companion) shows that friend; the friend's swaps name each other character in its place."""
    from importlib import import_module

    swap = import_module("research.spriteworld.swap_shots")
    row = {"spec": _spec(), "render_seed": 5, "num_frames": 6, "height": 64, "width": 96}
    scenery = TurnCast.from_row(_spec(), {}, NAMED).scenery
    first = _clip(_spec())[0]
    assert second_character(first[None], "Qiqi", scenery) == "Luna"
    redrawn = swap.redraw_first_frame(row, "Luna", "Kai")
    assert redrawn.shape == first.shape and second_character(redrawn[None], "Qiqi", scenery) == "Kai"
    follows = {"spec": _spec(action="walk", adverb="slowly", friend=""), "render_seed": 5, "num_frames": 6,
               "companion": "Luna"}
    walk = TurnCast.from_row(follows["spec"], follows, UNNAMED).scenery
    assert second_character(swap.redraw_first_frame(follows, "Luna", "Momo")[None], "Qiqi", walk) == "Momo"
    caption = "Character: Qiqi; Motion: happily talk with Luna; Background: noon park. Companion: Luna."
    assert swap.friend_swaps(caption, "Qiqi", "Luna", 2) == [("Momo", caption.replace("Luna", "Momo")),
                                                            ("Kai", caption.replace("Luna", "Kai"))]
    assert swap.friend_swaps(caption, "Qiqi", "Momo", 2) == []  # swaps of another name than the friend's


def test_friend_pairs_splits_friend_turns_by_what_was_held_out(tmp_path, capsys):
    """research/spriteworld/friend_pairs.py: every friend turn of a memory world's held-out games is a friend-pair,
    action-pair or seen turn as the data config held them out; two runs average turn by turn; bad input is one
    line and writes nothing."""
    import json
    from collections import Counter
    from importlib import import_module

    from animegamer.config import SpriteWorldConfig
    from animegamer.data.manifest import read_manifest
    from animegamer.data.stage_b import held_out_friends
    from animegamer.eval.games import load_games
    from animegamer.spriteworld.films import write_dataset

    tool = import_module("research.spriteworld.friend_pairs")
    data = tmp_path / "data"
    write_dataset(SpriteWorldConfig(output_dir=str(data), num_films=12, shots_per_film=6, height=48, width=64,
                                    num_frames=9, test_fraction=0.5, workers=1, memory=True,
                                    held_out_pairs=["Qiqi:Luna", "Momo:fly"]), progress=False)
    games = load_games(data / "games")
    kinds = tool.turn_kinds(games, held_out_friends(read_manifest(data / "clips.jsonl")))
    assert set(Counter(kinds.values())) == set(tool.KINDS)
    by_id = {g.game_id: g for g in games}
    for (game_id, turn), kind in kinds.items():
        cast = by_id[game_id].cast(turn)
        assert (kind == "friend pair") == ({cast.hero, cast.friend} == {"Qiqi", "Luna"})
    # run a draws only the friend-pair turns right, run b every turn; a turn b did not score is left out
    left_out = min(key for key, kind in kinds.items() if kind == "seen")
    results = []
    for name, right in (("a", lambda kind: kind == "friend pair"), ("b", lambda kind: True)):
        lines = []
        for (game_id, turn), kind in sorted(kinds.items()):
            if name == "b" and (game_id, turn) == left_out:
                continue
            metric = "friend_named" if by_id[game_id].cast(turn).named else "friend_remembered"
            values = {metric: float(right(kind))}
            lines.append(json.dumps({"system": "animegamer", "game_id": game_id, "turn": turn, "values": values}))
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        results.append(str(path))
    out = tmp_path / "pairs.json"
    report = tool.main(["--games", str(data / "games"), "--manifest", str(data / "clips.jsonl"),
                        "--results", *results, "--out", str(out)])
    assert report["held_out_pairs"] == ["Luna+Qiqi"] and json.loads(out.read_text()) == report
    cells = {(c["kind"], c["metric"]): c for c in report["cells"]}
    assert {c["mean"] for k, c in cells.items() if k[0] == "friend pair"} == {1.0}
    assert {c["mean"] for k, c in cells.items() if k[0] != "friend pair"} == {0.5}  # (0 + 1) / 2
    counted = Counter(kinds.values())
    assert sum(c["turns"] for k, c in cells.items() if k[0] == "seen") == counted["seen"] - 1
    assert sum(c["turns"] for k, c in cells.items() if k[0] == "friend pair") == counted["friend pair"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        tool.main(["--games", str(data / "games"), "--manifest", str(tmp_path / "none.jsonl"),
                   "--results", *results, "--out", str(tmp_path / "bad.json")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("error: ") and "\n" not in err
    assert not (tmp_path / "bad.json").exists()
