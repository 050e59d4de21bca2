"""research/spriteworld/demo_cast.py: who the clips of a played game draw, scored against the game's own rules."""

from __future__ import annotations

import json
from importlib import import_module

import pytest

from animegamer.data.video import write_mp4
from animegamer.spriteworld.animate import render_shot
from animegamer.spriteworld.memory import follows, resolve_game
from animegamer.spriteworld.world import spec_from_instruction
from animegamer.states import Instruction, read_game_file

GAME = "game_demo/spriteworld.txt"
demo_cast = import_module("research.spriteworld.demo_cast")


def _spec(motion: str, background: str = "noon park"):
    return spec_from_instruction(Instruction("Qiqi", motion, background))


def test_follows_two_turns_after_a_social_one_and_a_sleep_ends_it():
    shots = [_spec("calmly walk"), _spec("happily talk with Momo"), _spec("quickly run"), _spec("calmly walk"),
             _spec("calmly walk"), _spec("happily talk with Luna"), _spec("peacefully sleep", "night bedroom"),
             _spec("calmly walk")]
    assert follows(shots) == ["", "", "Momo", "Momo", "", "", "", ""]
    assert follows(shots, "Kai") == ["", "", "Kai", "Kai", "", "", "", ""]  # a film's one friend


def _draw_game(folder, companion_of=lambda t, c: c):
    specs = resolve_game(read_game_file(GAME))
    for t, (spec, companion) in enumerate(zip(specs, follows(specs), strict=True)):
        home = [1, 2, True] if spec.place in ("bedroom", "kitchen") else None
        write_mp4(folder / f"turn_{t:03d}.mp4", render_shot(spec, t, home=home, companion=companion_of(t, companion)))
    return specs


def test_the_worlds_own_drawings_of_the_demo_game_are_right(tmp_path):
    _draw_game(tmp_path)
    report = demo_cast.main(["--game", GAME, "--clips", str(tmp_path), "--out", str(tmp_path / "cast.json")])
    rows = report["rows"]
    assert report["turns"] == 8 and report["hero_on_screen"] == 8
    # turn 4 names Momo; the two turns after it and after `play ball with friend` show Momo unsaid
    assert [r["friend"] for r in rows] == ["", "", "", "Momo", "Momo", "Momo", "Momo", "Momo"]
    assert [r["named"] for r in rows[3:]] == [True, False, False, False, False]
    assert report["friend_turns"] == 5 and report["friend_right"] == 5 and all(r["right"] for r in rows)
    assert rows[7]["home_look"] == [1, 2, True] and rows[2]["home_look"] is None  # the home drawn is found
    assert json.loads((tmp_path / "cast.json").read_text())["friend_right"] == 5


def test_a_wrong_friend_or_none_is_counted_wrong(tmp_path):
    _draw_game(tmp_path, lambda t, c: {4: "Luna", 6: ""}.get(t, c))
    report = demo_cast.main(["--game", GAME, "--clips", str(tmp_path), "--out", str(tmp_path / "cast.json")])
    rows = report["rows"]
    assert rows[4]["drawn_second"] == "Luna" and rows[4]["friend_remembered"] == 0.0 and not rows[4]["right"]
    assert rows[6]["drawn_second"] is None and rows[6]["friend_remembered"] == 0.0
    assert report["friend_right"] == 3


def test_missing_clips_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        demo_cast.main(["--game", GAME, "--clips", str(tmp_path), "--out", str(tmp_path / "cast.json")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: 8 of 8 turns have no clip")
    assert not (tmp_path / "cast.json").exists()
