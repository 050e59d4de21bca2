"""A turn's clip is written off the turn's critical path: the turn returns once its frames are decoded, its gif and
mp4 are written by the game's writer thread in turn order, the game waits for them wherever the files matter
(undo, save, :load, quit, rendering a turn again), a write that fails leaves neither file and the turn played, and
an interrupted or ending game keeps every file guarantee (docs/guarantees.md)."""

import dataclasses
import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from animegamer.data.video import probe_video, read_video
from animegamer.game.browser import WebGame, display_clip
from animegamer.game.clip_writer import ClipWriter
from animegamer.game.save import read_save
from animegamer.game.session import GameSession
from animegamer.game.terminal import load_game, run
from animegamer.game.turn import TurnEvents
from tests.helpers.clips import make_clip_frames
from tests.helpers.game import GAME, FailingRenderer

ROOT = Path(__file__).resolve().parents[1]
K = 2  # history_turns of tiny_overrides
pytestmark = pytest.mark.usefixtures("one_thread")


class HeldWriter(ClipWriter):
    """The game's real writer, held: its first job waits on a gate, so every clip handed to it stays unwritten
    (for certain, not by timing) until the game waits for the clips, which opens the gate, or the test does.
    ``interrupt`` waits raise KeyboardInterrupt first, as Ctrl-C does in a waiting main thread."""

    made: list["HeldWriter"] = []  # opened when the test ends (opened_at_teardown)

    def __init__(self, interrupt: int = 0):
        super().__init__("held-clip-writer")
        self.gate, self.waits, self.interrupt = threading.Event(), 0, interrupt
        HeldWriter.made.append(self)
        self.submit(self.gate.wait, label="the gate")

    def wait(self, timeout=None):
        self.waits += 1
        if self.interrupt:
            self.interrupt -= 1
            raise KeyboardInterrupt
        self.gate.set()
        return super().wait(timeout)

    def release(self) -> None:
        self.gate.set()
        super().wait()


@pytest.fixture(autouse=True)
def opened_at_teardown():
    """Every HeldWriter's gate is opened when its test ends, failed or not: a writer thread held for ever would
    keep the test process from exiting."""
    yield
    while HeldWriter.made:
        HeldWriter.made.pop().gate.set()


def held_game(played, out: Path, **writer) -> GameSession:
    session, _ = played
    out.mkdir(parents=True, exist_ok=True)
    return GameSession(dataclasses.replace(session.game), output_dir=out, writer=HeldWriter(**writer))


def saved_clips(save: Path) -> list[str]:
    """The clip paths a save names, one per turn (checked as a save first)."""
    turns = read_save(save, history_turns=K).turns
    with safe_open(str(save), framework="pt") as fh:
        clips = [turn["clip"] for turn in json.loads(fh.metadata()["game"])["turns"]]
    assert len(clips) == len(turns)
    return clips


def clip_files(folder: Path) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith(("turn_", ".turn_")))


def test_writes_run_in_order_in_one_thread_and_failures_are_recorded():
    writer, gate, seen = ClipWriter("w"), threading.Event(), []
    writer.submit(gate.wait)
    pending = [writer.submit(lambda i=i: seen.append((i, threading.current_thread().name)) or i, label=f"job {i}")
               for i in range(5)]
    failing = writer.submit(lambda: 1 / 0, label="turn 7")
    writer.submit(lambda: seen.append(("after", threading.current_thread().name)))
    assert writer.busy and not any(p.done for p in pending) and seen == []  # held behind the gate
    assert writer.wait(timeout=0) is False
    gate.set()
    assert writer.wait() and not writer.busy
    assert seen == [*((i, "w") for i in range(5)), ("after", "w")]  # FIFO, in the writer's own thread
    assert [p.result for p in pending] == list(range(5)) and all(p.ok for p in pending)
    assert failing.done and not failing.ok and isinstance(failing.error, ZeroDivisionError)
    assert writer.failures() == [failing] and writer.failures() == []  # each failure handed out once


def test_the_turn_returns_before_its_clip_is_written(played, tmp_path):
    game = held_game(played, tmp_path)
    decoded = []

    class Watcher(TurnEvents):
        def clip(self, frames):
            decoded.append(frames)

    turn = game.play(GAME[0], Watcher())
    # played and decoded; its clip is not written yet, and no path names a file that does not exist
    assert len(game.turns) == 1 and decoded[0].shape == (9, 48, 64, 3)
    assert turn.clip == turn.gif == "" and not turn.writing.done and clip_files(tmp_path) == []
    second = game.play(GAME[1])  # the next turn does not wait either
    assert second.clip == "" and not second.writing.done and clip_files(tmp_path) == []
    assert game.wait()  # opens the gate and waits: both clips, in turn order
    assert clip_files(tmp_path) == ["turn_000.gif", "turn_000.mp4", "turn_001.gif", "turn_001.mp4"]
    assert turn.wait_clip() and second.wait_clip() and turn.clip == str(tmp_path / "turn_000.mp4")
    assert turn.gif == str(tmp_path / "turn_000.gif")
    frames, _ = read_video(turn.clip)
    assert frames.shape == decoded[0].shape
    assert np.abs(frames.astype(int) - decoded[0].astype(int)).mean() < 10  # the decoded frames, H.264 apart


def test_a_failed_background_write_leaves_neither_file_and_the_game_playable(played, tmp_path):
    game = held_game(played, tmp_path / "game")
    (tmp_path / "game" / "turn_000.mp4").mkdir()  # something in the way of the mp4: its rename fails
    first = game.play(GAME[0])
    second = game.play(GAME[1])
    game.writer.release()
    assert not first.wait_clip() and isinstance(first.writing.error, OSError)
    assert (first.clip, first.gif) == ("", "") and not (tmp_path / "game" / "turn_000.gif").exists()
    assert second.wait_clip()  # the next write goes on
    assert clip_files(tmp_path / "game") == ["turn_000.mp4", "turn_001.gif", "turn_001.mp4"]  # (the directory)
    [line] = game.clip_failures()
    assert line.startswith("the clip of turn 0 was not written (IsADirectoryError: ") and "\n" not in line
    assert line.endswith("the turn is played without it") and game.clip_failures() == []
    # the turns are the game: it plays on and saves
    game.play(GAME[2])
    assert saved_clips(game.save(tmp_path / "g.save")) == ["", str(tmp_path / "game" / "turn_001.mp4"),
                                             str(tmp_path / "game" / "turn_002.mp4")]


def test_terminal_prints_the_result_then_the_clip_and_a_failed_clip_in_one_line(played, tmp_path):
    game = held_game(played, tmp_path)
    (tmp_path / "turn_001.mp4").mkdir()
    out = io.StringIO()
    final = run(game, io.StringIO("\n".join([GAME[0], GAME[1], GAME[2], ":quit"])), out, games_dir=tmp_path)
    text = out.getvalue()
    lines = text.splitlines()
    assert "Traceback" not in text and len(final.turns) == 3
    # each turn: its result, the bars, then its clip's line (or why there is none), before the next turn's output
    for index in range(3):
        start = lines.index(f"turn {index}: {final.turns[index].instruction}")
        block = lines[start:start + 6]
        assert block[1].startswith("  motion level") and [b.split()[0] for b in block[2:5]] == \
            ["stamina", "social", "entertainment"]
        if index == 1:
            assert block[5].startswith("error: the clip of turn 1 was not written (IsADirectoryError: ")
            assert block[5].endswith("; the turn is played without it")
        else:
            assert block[5] == f"  clip: {tmp_path / f'turn_{index:03d}.mp4'}"
    assert sum(line.startswith("error:") for line in lines) == 1
    assert saved_clips(tmp_path / "game.save") == [str(tmp_path / "turn_000.mp4"), "",
                                                   str(tmp_path / "turn_002.mp4")]


def test_undo_waits_for_the_clips_and_removes_the_undone_one(played, tmp_path):
    game = held_game(played, tmp_path / "game")
    first, second = game.play(GAME[0]), game.play(GAME[1])
    undone = game.undo()  # waits, then removes the undone turn's clip: nothing of it is written later
    assert undone is second and (undone.clip, undone.gif) == ("", "") and game.writer.waits >= 1
    game.writer.release()
    assert clip_files(tmp_path / "game") == ["turn_000.gif", "turn_000.mp4"] and first.clip


def test_save_waits_for_the_clips_and_names_them(played, tmp_path):
    game = held_game(played, tmp_path / "saved")
    turn = game.play(GAME[0])
    clips = saved_clips(game.save(tmp_path / "saved.save"))  # the save names the written clip
    assert clips == [turn.clip] and turn.clip == str(tmp_path / "saved" / "turn_000.mp4")


def test_a_turn_is_rendered_again_once_its_clip_is_written(played, tmp_path):
    game = held_game(played, tmp_path / "rendered")
    turn = game.play(GAME[0])
    before = turn.writing
    game.render_turn(turn)  # renders again only once the first write is done
    assert before.ok and turn.writing is not before
    assert turn.wait_clip() and clip_files(tmp_path / "rendered") == ["turn_000.gif", "turn_000.mp4"]


def test_terminal_load_waits_for_the_current_games_clips(played, tmp_path):
    _, other = played
    game = held_game(played, tmp_path / "games" / "current")
    turn = game.play(GAME[0])
    out = io.StringIO()
    loaded = load_game(game, str(other), tmp_path / "games", out)  # the current game's clip, then its autosave
    assert turn.clip and len(loaded.turns) == 2
    assert saved_clips(tmp_path / "games" / "current" / "game.save") == [turn.clip]


@pytest.mark.parametrize("interrupts", [1, 2])
def test_ctrl_c_while_a_clip_is_written_keeps_the_turn_and_still_autosaves(played, tmp_path, interrupts):
    """Ctrl-C while the terminal waits for a clip: the turn stays played, and leaving saves it; a second Ctrl-C
    while leaving saves without waiting. Either way the clip is written whole, with no temp file left."""
    game = held_game(played, tmp_path, interrupt=interrupts)
    out = io.StringIO()
    final = run(game, io.StringIO(GAME[0] + "\n"), out, games_dir=tmp_path)
    text = out.getvalue()
    assert "interrupted: turn 0 is played; its clip is still being written" in text and len(final.turns) == 1
    assert f"saved 1 turns to {tmp_path / 'game.save'} before leaving" in text and "Traceback" not in text
    if interrupts == 2:
        assert "interrupted: saving without waiting for the clips being written" in text
        assert saved_clips(tmp_path / "game.save") == [""]  # not written when saved: no path to a missing file
        game.writer.release()
    else:
        assert saved_clips(tmp_path / "game.save") == [str(tmp_path / "turn_000.mp4")]
    assert game.writer.wait() and clip_files(tmp_path) == ["turn_000.gif", "turn_000.mp4"]  # no temp file


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("CUDA out of memory.")])
def test_a_turn_that_fails_while_the_last_clip_is_written_leaves_both_as_they_should_be(played, tmp_path, error):
    """The next turn fails (Ctrl-C, an error in a model) while the clip of the turn before is still being written:
    that turn is played with its whole clip, the failed one leaves nothing, and leaving saves the game."""
    session, _ = played
    game = held_game(played, tmp_path, interrupt=1)  # Ctrl-C while waiting for turn 0's clip: it stays pending
    game.game.renderer = FailingRenderer(session.game.renderer, None)
    script = iter([GAME[0], GAME[1]])

    class Lines(io.StringIO):
        def readline(self, *args):
            line = next(script, "")
            if line == GAME[1]:  # the second turn fails after its first frames are decoded
                game.game.renderer.error = error
            return line + "\n" if line else ""

    out = io.StringIO()
    final = run(game, Lines(), out, games_dir=tmp_path)
    text = out.getvalue()
    assert "interrupted: turn 0 is played; its clip is still being written" in text and len(final.turns) == 1
    assert ("cancelled; the game is as it was (1 turns)" if isinstance(error, KeyboardInterrupt)
            else "error: the turn failed (RuntimeError: CUDA out of memory.); the game is as it was (1 turns)") in text
    assert saved_clips(tmp_path / "game.save") == [str(tmp_path / "turn_000.mp4")] and "Traceback" not in text
    assert clip_files(tmp_path) == ["turn_000.gif", "turn_000.mp4"]  # nothing of turn 1, no temp file


def test_an_exiting_process_finishes_the_clip_being_written(tmp_path):
    """The writer's thread is no daemon: a process that ends while a clip is queued writes it whole first."""
    code = (
        "import threading, numpy as np\n"
        "from animegamer.game.clip_writer import ClipWriter\n"
        "from animegamer.game.turn import write_clip\n"
        "writer = ClipWriter()\n"
        "writer.submit(threading.main_thread().join)  # held until the interpreter starts to exit\n"
        f"writer.submit(write_clip, np.full((9, 48, 64, 3), 200, np.uint8), {str(tmp_path / 'turn_000')!r}, 8)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert clip_files(tmp_path) == ["turn_000.gif", "turn_000.mp4"] and probe_video(tmp_path / "turn_000.mp4")


def test_the_page_shows_the_decoded_clip_before_its_files_are_written(played, tmp_path):
    session, _ = played
    web = WebGame(dataclasses.replace(session.game), tmp_path / "web")
    game = web.new_session()
    game.writer = HeldWriter()
    (Path(game.output_dir) / "turn_001.mp4").mkdir()  # turn 1's clip will fail to be written
    views = list(web.play("Qiqi", "quickly", "run", "park", "", game))
    turn = game.turns[0]
    # the whole turn on the page while its gif and mp4 are held: the display-size copy, from the frames in memory
    assert game.writer.waits == 0 and turn.clip == "" and views[-1][1].startswith("Turn 0: motion level")
    shown = Path(views[-1][2])
    assert shown.name.startswith("turn_000_x8_") and probe_video(shown).height == 384
    assert not (Path(game.output_dir) / "turn_000.mp4").exists()
    views = list(web.play("Qiqi", "", "eat", "park", "", game))
    assert Path(views[-1][2]).name.startswith("turn_001_x8_") and "Clip not written" not in views[-1][1]
    game.writer.release()
    assert turn.clip and not game.turns[1].clip
    _, status = web.save(game)  # the failure is told in the next status, once
    assert status.startswith("Saved 2 turns.") and status.count("Clip not written") == 1
    assert "the clip of turn 1 was not written" in status.replace("\\", "")
    assert "Clip not written" not in web.undo(game)[1]


def test_display_copy_is_named_by_the_frames(tmp_path):
    stem = tmp_path / "turn_001"
    a, b = make_clip_frames(speed=3.0), make_clip_frames(speed=-2.0)
    first = display_clip(a, stem, 8)
    assert first.name.startswith("turn_001_x8_") and display_clip(a, stem, 8) == first  # same frames, same file
    other = display_clip(b, stem, 8)  # a turn undone and played again: a new name, the old copy removed
    assert other != first and not first.exists() and [p.name for p in tmp_path.iterdir()] == [other.name]
    shown, _ = read_video(other)
    assert shown.shape == (9, 384, 512, 3)
