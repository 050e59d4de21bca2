"""One turn for every entry point: the terminal game, the browser game, inference_MLLM.py + inference_Decoder.py,
the evaluation and the speed harness all play :meth:`AnimeGamer.play_turn` (inference_Decoder.py its render step)
and, for the same game and seed, give the same turns: shot representations, values, states and clips."""

import io
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageSequence

from animegamer.bench.turn import TurnSettings, bench_turn, make_history
from animegamer.config import load_config
from animegamer.eval.benchmark import BenchmarkGame
from animegamer.eval.systems import AnimeGamerSystem
from animegamer.game.browser import WebGame
from animegamer.game.build import build_game
from animegamer.game.results import load_results
from animegamer.game.session import GameSession
from animegamer.game.terminal import run
from animegamer.game.turn import AnimeGamer, Turn
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.states import CharacterState, parse_tags

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "spriteworld" / "inference.yaml"
SHOTS = (  # three turns of game_demo/spriteworld.txt's kind, as benchmark ground truth (the values are not used)
    "<S>Qiqi</S><MD>wake up</MD><EV>morning bedroom</EV><ML>1</ML><MA>slowly</MA><SC>0</SC><ET>0</ET><ST>0</ST>",
    "<S>Qiqi</S><MD>eat</MD><EV>noon kitchen</EV><ML>2</ML><MA>happily</MA><SC>0</SC><ET>1</ET><ST>1</ST>",
    "<S>Qiqi</S><MD>walk</MD><EV>here</EV><ML>3</ML><MA>calmly</MA><SC>0</SC><ET>0</ET><ST>0</ST>",
)
pytestmark = pytest.mark.usefixtures("one_thread")


def gif_frames(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.stack([np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)])


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The shipped SpriteWorld game (2 denoising steps), the benchmark game and its reference turns, played by
    calling play_turn directly. One torch thread, as every test of this module runs (``one_thread``): a module
    fixture is set up before a test's function fixtures, and 1 and 2 threads round a few pixels apart."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = load_config(CONFIG, ["sampling.steps=2"])
    game = build_game(cfg)
    bench_game = BenchmarkGame("g0", "Qiqi", tuple(parse_tags(s) for s in SHOTS), Path("."))
    instructions = [i.render() for i in bench_game.instructions]
    out = tmp_path_factory.mktemp("reference")
    turns: list[Turn] = []
    for text in instructions:
        turns.append(game.play_turn(turns, text, out_dir=out))
    torch.set_num_threads(before)
    return cfg, game, bench_game, instructions, turns


@pytest.fixture
def calls(monkeypatch):
    """Every play_turn and render_turn call: (method, the turn it returned)."""
    seen = []
    play, render = AnimeGamer.play_turn, AnimeGamer.render_turn

    def play_turn(self, *args, **kwargs):
        turn = play(self, *args, **kwargs)
        seen.append(("play_turn", turn))
        return turn

    def render_turn(self, turn, *args, **kwargs):
        seen.append(("render_turn", turn))
        return render(self, turn, *args, **kwargs)

    monkeypatch.setattr(AnimeGamer, "play_turn", play_turn)
    monkeypatch.setattr(AnimeGamer, "render_turn", render_turn)
    return seen


def same_turns(turns, reference, clips: bool = True) -> None:
    assert len(turns) == len(reference)
    for turn, ref in zip(turns, reference, strict=True):
        assert (turn.index, turn.instruction, turn.values, turn.state) == (ref.index, ref.instruction, ref.values,
                                                                            ref.state)
        assert torch.equal(turn.shot_embeds, ref.shot_embeds) and turn.prompt_tokens == ref.prompt_tokens
        if clips:
            assert Path(turn.clip).name == f"turn_{turn.index:03d}.mp4" and Path(turn.clip).is_file()
            assert np.array_equal(gif_frames(turn.gif), gif_frames(ref.gif))


def test_the_turns_are_distinct_and_use_the_history(shipped):
    *_, turns = shipped
    assert [t.index for t in turns] == [0, 1, 2] and turns[2].prompt_tokens > turns[1].prompt_tokens > \
        turns[0].prompt_tokens  # the history is in the prompt
    assert not torch.equal(turns[0].shot_embeds, turns[1].shot_embeds)
    assert gif_frames(turns[0].gif).shape == (9, 64, 96, 3)
    assert Path(turns[0].gif).with_suffix(".mp4") == Path(turns[0].clip)


def test_terminal_game(shipped, calls, tmp_path):
    _, game, _, instructions, reference = shipped
    final = run(GameSession(game, output_dir=tmp_path), io.StringIO("\n".join([*instructions, ":quit"])),
                io.StringIO())
    assert [name for name, _ in calls] == ["render_turn", "play_turn"] * 3  # play_turn renders its turn
    same_turns(final.turns, reference)


def test_browser_game(shipped, calls, tmp_path):
    _, game, _, instructions, reference = shipped
    web, session = WebGame(game, tmp_path), None
    for text in instructions:
        *_, view = web.play("", "", "", "", text, session)
        session = view[0]
    assert [name for name, _ in calls] == ["render_turn", "play_turn"] * 3
    assert session.wait()  # the clips are written in the background
    same_turns(session.turns, reference)


def test_inference_mllm_then_decoder(shipped, calls, tmp_path):
    cfg, _, _, instructions, reference = shipped
    (tmp_path / "game.txt").write_text("\n".join(instructions) + "\n")
    args = ["--config", str(CONFIG), "sampling.steps=2", f"output_dir={tmp_path / 'out'}",
            f"game={tmp_path / 'game.txt'}"]
    import_module("inference_MLLM").main(args)
    assert [name for name, _ in calls] == ["play_turn"] * 3  # no decoder: nothing rendered
    _, recorded = load_results(tmp_path / "out")
    for (state, shot), ref in zip(recorded, reference, strict=True):
        assert torch.equal(shot, ref.shot_embeds) and state["values"] == vars(ref.values)
        assert CharacterState.from_dict(state["state"]) == ref.state
    calls.clear()
    import_module("inference_Decoder").main(args)
    assert [name for name, _ in calls] == ["render_turn"] * 3  # the render step of the same object
    same_turns([turn for _, turn in calls], reference)


def test_evaluation(shipped, calls, tmp_path):
    _, game, bench_game, _, reference = shipped
    [outputs] = AnimeGamerSystem(game, "cpu").play_games([bench_game], [tmp_path], render_batch=2)
    assert [name for name, _ in calls] == ["play_turn"] * 3  # planned without rendering, then rendered in batches
    same_turns([turn for _, turn in calls], reference, clips=False)
    calls.clear()
    for output, ref in zip(outputs, reference, strict=True):
        assert output.values == ref.values and Path(output.clip) == tmp_path / f"turn_{ref.index:03d}.mp4"
        assert Path(output.clip).with_suffix(".gif").is_file()  # the game's clip layout
        # rendered in batches of 2 (render_many): the game's clip up to float rounding
        alone = game.render_turn(ref, None)
        gap = np.abs(output.frames.astype(int) - alone.astype(int))
        assert output.frames.shape == alone.shape and gap.max() <= 1 and (gap > 0).mean() < 1e-3


def test_speed_harness(shipped, calls):
    cfg, game, _, instructions, _ = shipped
    settings = TurnSettings(cfg.sampling, history_turns=2, warmup=0, repeats=1, merge_lora=False, low_memory=False)
    result = bench_turn(game.renderer.decoder, game.predictor.model, settings, "cpu", peak_flops=1e12)
    assert result["play_turn"]["turn_s"] > 0
    assert [name for name, _ in calls] == ["render_turn", "play_turn"]  # warmup 0, one repeat
    timed = [calls[-1][1]]
    # the same turn as play_turn on the harness's history, from the shipped game object
    history = make_history(2, *game.predictor.shot_shape, settings.seed)
    earlier = [Turn(i, h.instruction, h.values, CharacterState(), h.shot_embeds, 0) for i, h in enumerate(history)]
    again = game.play_turn(earlier, timed[0].instruction, render=False)
    assert torch.equal(again.shot_embeds, timed[0].shot_embeds) and again.values == timed[0].values
    assert timed[0].index == 2 and again.prompt_tokens == timed[0].prompt_tokens


def test_inference_scripts_honour_merge_lora(shipped, monkeypatch, tmp_path):
    """inference_MLLM.py and inference_Decoder.py build their models as every game does (build_game): merge_lora
    folds each LoRA in, and the turns stay the reference turns up to weight rounding."""
    *_, instructions, reference = shipped
    merged = []
    for cls in (AnimeGamerMLLM, AnimationShotDecoder):
        def merge_lora(self, merge=cls.merge_lora, name=cls.__name__):
            merged.append(name)
            return merge(self)

        monkeypatch.setattr(cls, "merge_lora", merge_lora)
    (tmp_path / "game.txt").write_text("\n".join(instructions) + "\n")
    args = ["--config", str(CONFIG), "sampling.steps=2", f"output_dir={tmp_path / 'out'}",
            f"game={tmp_path / 'game.txt'}", "merge_lora=true"]
    import_module("inference_MLLM").main(args)
    assert merged == ["AnimeGamerMLLM"]
    _, recorded = load_results(tmp_path / "out")
    for (state, shot), ref in zip(recorded, reference, strict=True):
        assert state["values"] == vars(ref.values)
        torch.testing.assert_close(shot, ref.shot_embeds, rtol=1e-4, atol=1e-4)
    import_module("inference_Decoder").main(args)
    assert merged == ["AnimeGamerMLLM", "AnimationShotDecoder"]
    assert all((tmp_path / "out" / f"turn_{i:03d}.gif").is_file() for i in range(3))
