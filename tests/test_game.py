"""The game: sessions with a sliding window, save/load, inference_Decoder, the terminal CLI and the browser app."""

import importlib
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from animegamer.config import load_config
from animegamer.data.video import probe_video
from animegamer.game.build import build_session
from animegamer.game.session import GameSession
from animegamer.game.terminal import run
from tests.helpers.game import GAME, TINY, tiny_overrides
from tests.helpers.gradio_app import launch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
@pytest.fixture
def tiny_cfg(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path):
    return load_config(TINY, tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path / "play"))


def test_long_game_keeps_the_prompt_bounded(tiny_cfg):
    session = build_session(tiny_cfg, render=False)
    lengths = [session.play(GAME[i % len(GAME)]).prompt_tokens for i in range(60)]
    assert len(session.turns) == 60
    assert max(lengths[3:]) <= max(lengths[:3]) + 10  # only instruction length varies once the window is full
    assert lengths[2] > lengths[0]  # history really is in the prompt
    state = session.state
    assert all(0 <= getattr(state, n) <= 100 for n in ("stamina", "social", "entertainment"))


def test_save_load_then_next_turn_matches_continuing(tiny_cfg, tmp_path):
    session = build_session(tiny_cfg)
    for text in GAME[:2]:
        session.play(text)
    save = session.save(tmp_path / "g.save")
    continued = session.play(GAME[2])
    loaded = GameSession.load(save, session.game, output_dir=tmp_path / "resumed")
    assert all(t.clip == "" for t in loaded.turns)  # paths from the file are never used
    assert [t.instruction for t in loaded.turns] == GAME[:1] + ["Qiqi eats breakfast in the kitchen"]
    resumed = loaded.play(GAME[2])
    assert resumed.values == continued.values and resumed.state == continued.state
    assert torch.equal(resumed.shot_embeds, continued.shot_embeds)
    from animegamer.data.video import read_video

    assert continued.wait_clip() and resumed.wait_clip()  # the clips are written in the background
    a, _ = read_video(continued.clip)
    b, _ = read_video(resumed.clip)
    assert a.shape == (9, 48, 64, 3) and np.array_equal(a, b)
    assert Path(continued.gif).is_file()
    undone = loaded.undo()
    assert undone.index == 2 and len(loaded.turns) == 2
    with pytest.raises(ValueError, match="not an animegamer saved game"):
        bad = tmp_path / "bad.save"
        bad.write_bytes(b"nonsense")
        GameSession.load(bad, session.game)


def test_bad_instruction_fails_before_the_model(tiny_cfg):
    session = build_session(tiny_cfg, render=False)
    calls = []
    real = session.game.predictor.predict_turn
    session.game.predictor.predict_turn = lambda *a: calls.append(a) or real(*a)
    for bad in ("", "Character: Qiqi; Motion: ; Background: park."):
        with pytest.raises(ValueError):
            session.play(bad)
    assert not calls and not session.turns


def _entry(name):
    """A program at the checkout's root (inference_MLLM, inference_Decoder, app) as a module."""
    return importlib.import_module(name)


@pytest.mark.slow
def test_inference_decoder_renders_every_turn(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path):
    out = tmp_path / "game"
    game = tmp_path / "g.txt"
    game.write_text("\n".join(GAME) + "\n")
    args = ["--config", str(TINY), *tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, out), f"game={game}"]
    _entry("inference_MLLM").main(args)
    written = _entry("inference_Decoder").main(args)
    clips = sorted(out.glob("turn_???.mp4"))
    assert [c.name for c in clips] == ["turn_000.mp4", "turn_001.mp4", "turn_002.mp4"]
    assert len(list(out.glob("turn_???.gif"))) == 3 and written["clips"] == clips[0]
    info = probe_video(written["game"])
    assert info.num_frames == 27 and (info.height, info.width) == (48, 64)
    from PIL import Image

    sheet = Image.open(written["contact_sheet"])
    assert sheet.height >= 3 * 48 and sheet.width > 6 * 64


def test_terminal_cli_scripted_session(tiny_cfg, tmp_path):
    session = build_session(tiny_cfg, render=False)
    save = tmp_path / "cli.save"
    script = io.StringIO("\n".join([
        GAME[0], GAME[1], f":save {save}", ":undo", ":state", f":load {save}", GAME[2], ":bogus",
        "Character: Qiqi; Motion: ; Background: park.", ":quit", "never read",
    ]))
    out = io.StringIO()
    final = run(session, script, out)
    text = out.getvalue()
    assert "turn 0:" in text and "turn 1:" in text and f"saved 2 turns to {save}" in text
    assert "undid turn 1" in text and "loaded 2 turns" in text and "turn 2:" in text
    assert "unknown command :bogus" in text and "error:" in text and "'motion'" in text
    assert len(final.turns) == 3 and "stamina" in text


@pytest.mark.slow
def test_gradio_app_plays_two_turns_and_rejects_empty(tiny_cfg, tmp_path, monkeypatch):
    import os

    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from gradio_client import Client

    from animegamer.game.browser import build_app, compose_instruction

    assert compose_instruction("Qiqi", "gently", "lie down", "night bedroom", "") == \
        "Character: Qiqi; Motion: gently lie down; Background: night bedroom."
    assert compose_instruction("", "", "", "", "  dance  ") == "dance"
    template = build_session(tiny_cfg)
    app = build_app(template.game, tmp_path / "web")
    launch(app, monkeypatch)
    try:
        client = Client(app.local_url, verbose=False)
        first = client.predict("Qiqi", "quickly", "run", "park", "", api_name="/play")
        second = client.predict("Qiqi", "", "eat", "night kitchen", "", api_name="/play")
        empty = client.predict("", "", "", "", "", api_name="/play")
    finally:
        app.close()
    status, video, bars, history = second
    assert "Turn 1" in status and video is not None
    assert len(history["data"]) == 2 and history["data"][1][0] == 1
    assert "Turn 0" in first[0]
    assert "Not played" in empty[0] and "empty" in empty[0]
