"""A turn that fails for any reason leaves the game as it was (no half-written clip) and the game goes on; a game
that must end saves its turns first; the browser shows the clip of the turn that exists now, and every text from a
player or a file as text."""

import dataclasses
import errno
import html
import io
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from markdown_it import MarkdownIt

from animegamer.config import load_config
from animegamer.data.video import read_video, write_mp4
from animegamer.data.vocabulary import Vocabulary
from animegamer.game import turn as turn_module
from animegamer.game.browser import WebGame, as_text, large_clip
from animegamer.game.build import build_session
from animegamer.game.clip_writer import ClipWriter
from animegamer.game.contact_sheet import upscale
from animegamer.game.save import read_save
from animegamer.game.session import GameSession
from animegamer.game.terminal import run
from animegamer.game.turn import TurnEvents
from tests.helpers.clips import make_clip_frames
from tests.helpers.game import GAME, TINY, FailingRenderer, rewrite, tiny_overrides, turn0

K = 2  # history_turns of tiny_overrides


ERRORS = {
    "cuda-oom": RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has a total capacity of 79 GiB"),
    "zero-division": ZeroDivisionError("division by zero"),
    "key": KeyError("transformer.blocks.0"),
    "assertion": AssertionError("latents must be 5-D"),
    "memory": MemoryError(),
    "not-implemented": NotImplementedError("fp8 on this GPU"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_terminal_turn_that_fails_in_a_model_keeps_the_game(played, tmp_path, case):
    session, _ = played
    game = GameSession(dataclasses.replace(session.game), output_dir=tmp_path)
    game.play(GAME[0])
    game.game.renderer = FailingRenderer(session.game.renderer, ERRORS[case])
    out = io.StringIO()
    final = run(game, io.StringIO("\n".join([GAME[1], ":state", GAME[1], ":quit"])), out, games_dir=tmp_path)
    lines = out.getvalue().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: the turn failed ({type(ERRORS[case]).__name__}")
    assert errors[0].endswith("the game is as it was (1 turns)") and "Traceback" not in out.getvalue()
    # played again after the failure: the same turn the uninterrupted game played, and autosaved at :quit
    assert len(final.turns) == 2 and torch.equal(final.turns[1].shot_embeds, session.turns[1].shot_embeds)
    assert len(read_save(tmp_path / "game.save", history_turns=K).turns) == 2


@pytest.mark.parametrize("case", ["cuda-oom", "zero-division", "disk-full-on-gif"])
def test_a_failed_turn_leaves_no_half_of_its_clip(played, tmp_path, monkeypatch, case):
    session, _ = played
    # the disk fills up while the turn writes its clip itself (in the background, the turn stays played: see
    # test_clip_writer.py)
    writer = None if case == "disk-full-on-gif" else ClipWriter()
    game = GameSession(dataclasses.replace(session.game), output_dir=tmp_path, writer=writer)
    game.play(GAME[0])
    game.wait()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    if case == "disk-full-on-gif":
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(turn_module, "write_gif", full)
    else:  # the first frames went to the turn's gif, then the model failed
        game.game.renderer = FailingRenderer(session.game.renderer, ERRORS[case])
        # one latent frame per VAE batch: the tiny clip decodes in three chunks, so its first frames come early
        monkeypatch.setattr(session.game.renderer.decoder.vae, "num_latent_frames_batch_size", 1)
    stages = []

    class Terminal(TurnEvents):
        early_gif = True  # as the terminal: the first frames to the turn's gif at once

        def stage(self, what, done):
            stages.append(what)

    with pytest.raises((OSError, RuntimeError, ZeroDivisionError)):
        game.play(GAME[1], Terminal())
    # the early gif (the terminal's progress line names it) was written before the failure
    assert case == "disk-full-on-gif" or any(stage.startswith("first ") and stage.endswith(
        f" frames: {tmp_path / 'turn_001.gif'}") for stage in stages)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing of turn 1 on disk
    assert len(game.turns) == 1


def test_sampling_steps_zero_in_a_running_game_is_one_line(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path):
    """The real sampler with 0 steps (the entry points refuse it at start; a game built in code still may)."""
    cfg = load_config(TINY, tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path) + ["sampling.steps=0"])
    game = build_session(cfg)
    out = io.StringIO()
    final = run(game, io.StringIO("\n".join([GAME[0], ":state", ":quit"])), out, games_dir=tmp_path)
    errors = [line for line in out.getvalue().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "the turn failed" in errors[0] and "the game is as it was (0 turns)" in errors[0]
    assert final.turns == [] and not list(tmp_path.glob("turn_*"))


class BrokenInput(io.StringIO):
    """Lines of a script; after them, reading fails as ``error`` (a terminal hung up, a stream not UTF-8)."""

    def __init__(self, lines, error):
        super().__init__("\n".join(lines) + "\n")
        self.left, self.error = len(lines), error

    def readline(self, *args):
        if self.left == 0:
            raise self.error
        self.left -= 1
        return super().readline(*args)


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"),
                                   UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
                                   SystemExit(1), RuntimeError("anything else")])
def test_a_game_that_must_end_saves_its_turns_first(played, tmp_path, error):
    session, _ = played
    game = GameSession(dataclasses.replace(session.game, renderer=None), output_dir=tmp_path)
    out = io.StringIO()
    if isinstance(error, OSError):  # EIO: the terminal is gone, which ends the game as end of input does
        run(game, BrokenInput([GAME[0], GAME[1]], error), out, games_dir=tmp_path)
    else:
        with pytest.raises(type(error)):
            run(game, BrokenInput([GAME[0], GAME[1]], error), out, games_dir=tmp_path)
    assert f"saved 2 turns to {tmp_path / 'game.save'} before leaving" in out.getvalue()
    assert len(read_save(tmp_path / "game.save", history_turns=K).turns) == 2


def distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_enlarged_clip_follows_the_clip_written_again_under_its_name(tmp_path):
    clip = tmp_path / "turn_001.mp4"
    copies = []
    for speed in (3.0, -2.0, 3.0):  # a turn, undone and played differently, then the first again
        frames = make_clip_frames(speed=speed)  # (9, 48, 64, 3)
        write_mp4(clip, frames, fps=8)
        large = large_clip(clip)
        shown, _ = read_video(large)
        assert shown.shape == (9, 384, 512, 3)
        # the enlarged copy is this clip (mp4 rounding apart), not the one written before under its name
        assert distance(shown, upscale(frames, 8)) < 3 < distance(shown, upscale(make_clip_frames(speed=-speed), 8))
        assert [p.name for p in tmp_path.glob("turn_001_x*.mp4")] == [large.name]  # the older copy removed
        copies.append(large.name)
    assert copies[0] != copies[1] and copies[0] == copies[2]


class Negative:
    """The real renderer, its frames (and first frames) turned into their negative: a turn that looks nothing like
    the same turn rendered plainly, so that the page's clip can be told apart from a stale one."""

    def __init__(self, renderer):
        self.renderer, self.fps = renderer, renderer.fps

    def latents(self, *args):
        return self.renderer.latents(*args)

    def chunk_count(self, latents):
        return self.renderer.chunk_count(latents)

    def decode(self, latents):
        for chunk in self.renderer.decode(latents):
            yield 255 - chunk


def test_browser_shows_the_clip_of_the_turn_played_after_undo(played, tmp_path, monkeypatch):
    session, _ = played
    # one latent frame per VAE batch: the tiny clip decodes in chunks, so the page gets its first frames early
    monkeypatch.setattr(session.game.renderer.decoder.vae, "num_latent_frames_batch_size", 1)
    web = WebGame(dataclasses.replace(session.game), tmp_path / "web")
    x = list(web.play("Qiqi", "quickly", "run", "park", "", None))
    game = x[-1][0]
    assert game.turns[0].wait_clip()  # written in the background
    x_clip, _ = read_video(game.turns[0].clip)
    web.undo(game)
    game.game.renderer = Negative(session.game.renderer)
    y = list(web.play("Qiqi", "", "eat", "night kitchen", "", game))
    assert "Turn 0:" in y[-1][1] and len(game.turns) == 1
    assert game.turns[0].wait_clip()
    y_clip, _ = read_video(game.turns[0].clip)
    shown, _ = read_video(y[-1][2])
    factor = shown.shape[1] // y_clip.shape[1]
    assert factor > 1 and distance(x_clip, y_clip) > 30  # two different turns
    # the page's copy is written from the decoded frames, the clip beside it too: two H.264 encodes apart
    assert distance(shown, upscale(y_clip, factor)) < 10 < 30 < distance(shown, upscale(x_clip, factor))
    previews = [read_video(view[2])[0] for view in y[:-1]]
    assert len(previews) == 1 and len(x) == len(y) == 2  # the first frames, then the whole clip
    first, n = previews[0], len(previews[0])
    assert distance(first, upscale(y_clip[:n], factor)) < 10 < 30 < distance(first, upscale(x_clip[:n], factor))


@pytest.mark.parametrize("case", ["cuda-oom", "zero-division", "key"])
def test_browser_turn_that_fails_leaves_the_game_and_no_file(played, tmp_path, monkeypatch, case):
    session, _ = played
    # first frames come early
    monkeypatch.setattr(session.game.renderer.decoder.vae, "num_latent_frames_batch_size", 1)
    web = WebGame(dataclasses.replace(session.game), tmp_path / "web")
    game = list(web.play("Qiqi", "quickly", "run", "park", "", None))[-1][0]
    game.wait()
    files = sorted(p.name for p in Path(game.output_dir).iterdir())
    game.game.renderer = FailingRenderer(session.game.renderer, ERRORS[case])
    views = list(web.play("Qiqi", "", "eat", "night kitchen", "", game))
    assert len(views) == 2 and "the first" in views[0][1]  # the first frames were on the page, then it failed
    assert views[-1][1].startswith(f"**Turn failed:** {type(ERRORS[case]).__name__}")
    assert views[-1][1].endswith("the game is as it was (1 turns).") and len(game.turns) == 1
    assert sorted(p.name for p in Path(game.output_dir).iterdir()) == files  # no clip, gif or preview of turn 1
    assert Path(views[-1][2]).name.startswith("turn_000_")  # turn 0's clip is on the page again


HOSTILE = [
    "<img src=http://127.0.0.1:9/track.png>",
    "![pixel](http://127.0.0.1:9/track.png)",
    "[click](javascript:alert(1))",
    "<script>alert(1)</script>",
    "<a href='http://x'>x</a> &lt;b&gt; &amp; *bold* _it_ `code` ~~gone~~ | a | b |",
    "http://127.0.0.1:9/auto www.example.com <http://127.0.0.1:9/x>",
    "line one\n# heading\n> quote\n- item\n\n<iframe src=http://x>",
    "$$\\href{http://x}{y}$$ \\(x\\)",
]
MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])  # the page's Markdown: GFM


def shown_as_text(status: str, hostile: str) -> None:
    """The status, rendered as the page's Markdown renders it, holds ``hostile`` as plain text: no element but the
    status's own paragraph, bold and italics, and the characters themselves once the entities are decoded."""
    rendered = MARKDOWN.render(status)
    assert set(re.findall(r"</?([a-zA-Z][a-zA-Z0-9]*)", rendered)) <= {"p", "strong", "em", "br"}, rendered
    text = html.unescape(re.sub(r"</?(p|strong|em|br)\s*/?>", "", rendered))
    assert " ".join(hostile.split()) in " ".join(text.split()), (hostile, text)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_as_text_renders_to_the_same_characters(hostile):
    assert MARKDOWN.render(as_text(hostile)) == f"<p>{html.escape(' '.join(hostile.split()), quote=False)}</p>\n"


@pytest.mark.parametrize("hostile", HOSTILE)
def test_every_status_quoting_a_player_or_a_file_is_text(played, tmp_path, hostile):
    session, save = played
    words = Vocabulary(("Qiqi",), ("quickly",), ("run",), ("park",))
    web = WebGame(dataclasses.replace(session.game, renderer=None), tmp_path / "web", vocabulary=words)
    # a save whose instruction is refused: the message quotes it
    bad = rewrite(save, tmp_path / "bad.save", turn0("instruction", "  " + hostile))
    _, status, *_ = web.load(str(bad), None)
    assert status.startswith("**Not loaded:**")
    shown_as_text(status, repr(("  " + hostile)[:60]))  # the message quotes the start of it
    # a save named by the player: the message names the file (by its name: the server's folders are not shown)
    named = tmp_path / (" ".join(hostile.split()).replace("/", "_")[:80] + ".save")
    named.write_bytes(b"not a save")
    _, status, *_ = web.load(str(named), None)
    shown_as_text(status, named.name)
    assert str(tmp_path) not in status and as_text(str(tmp_path)) not in status
    # a character the world never saw: the warning quotes it
    views = list(web.play(hostile.replace(";", ","), "quickly", "run", "park", "", None))
    shown_as_text(views[-1][1], "")
    assert "<img" not in MARKDOWN.render(views[-1][1]) and "The model guessed" in views[-1][1]
    # a turn that fails in a model: the message quotes the error
    game = views[-1][0]
    game.game.renderer = FailingRenderer(session.game.renderer, RuntimeError(hostile))
    views = list(web.play("Qiqi", "quickly", "run", "park", "", game))
    assert views[-1][1].startswith("**Turn failed:** RuntimeError: ")
    shown_as_text(views[-1][1], hostile)
