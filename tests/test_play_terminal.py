"""The terminal game as a newcomer plays it: `make play`'s command with scripted input, on the shipped SpriteWorld
checkpoint (no weights to build or download), and its hints, warnings, progress line and autosave."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from animegamer.config import load_config
from animegamer.data.vocabulary import load_vocabulary
from animegamer.game.build import build_session
from animegamer.game.session import GameSession
from animegamer.game.terminal import new_game_dir, run

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "spriteworld" / "inference.yaml"
TURNS = [
    "Character: Qiqi; Motion: happily eat; Background: morning kitchen.",
    "Character: Qiqi; Motion: calmly walk; Background: noon street.",
    "Character: Qiqi; Motion: quickly run; Background: noon park.",
]
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def test_make_play_with_scripted_input_writes_a_new_game_dir(tmp_path):
    """What `make play` runs, fed three turns, :save and :quit on stdin; a second game gets its own directory."""
    command = [sys.executable, "-m", "animegamer.play", "--config", str(CONFIG), f"output_dir={tmp_path}",
               "sampling.steps=4"]
    script = "\n".join([*TURNS, ":save", ":quit"]) + "\n"
    result = subprocess.run(command, input=script, capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    games = sorted(tmp_path.iterdir())
    assert len(games) == 1 and games[0].name.startswith("play_")
    assert sorted(p.name for p in games[0].glob("turn_*.mp4")) == ["turn_000.mp4", "turn_001.mp4", "turn_002.mp4"]
    assert f"saved 3 turns to {games[0] / 'game.save'}" in result.stdout
    assert "before leaving" not in result.stdout  # saved already: nothing to autosave
    assert "\r" not in result.stdout + result.stderr  # no progress bars or lines in a log
    again = subprocess.run(command, input=TURNS[0] + "\n", capture_output=True, text=True, cwd=ROOT, timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr
    second = [p for p in tmp_path.iterdir() if p != games[0]]
    assert len(second) == 1 and [p.name for p in second[0].glob("turn_*.mp4")] == ["turn_000.mp4"]
    assert (second[0] / "game.save").is_file() and "before leaving" in again.stdout  # end of input autosaved


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    cfg = load_config(CONFIG, ["sampling.steps=2"])
    return build_session(cfg, output_dir=tmp_path_factory.mktemp("unused")), load_vocabulary(cfg.mllm_checkpoint)


def test_hints_warnings_progress_and_help(shipped, tmp_path):
    template, vocabulary = shipped
    session = GameSession(template.game, output_dir=tmp_path)
    script = io.StringIO("\n".join(["", "Character: Bob; Motion: gently lie down; Background: night bedroom.",
                                    ":help", ":undo", ":quit"]))
    out = Terminal()
    final = run(session, script, out, vocabulary)
    text = out.getvalue()
    assert f"type what the character does next, e.g. {vocabulary.placeholder()}" in text
    assert vocabulary.placeholder().startswith(f"Character: {vocabulary.characters[0]}; Motion: happily walk;")
    warned = text.index(f"warning: character 'Bob' is not one of {', '.join(vocabulary.characters)}")
    assert text.index("warning: motion: 'lie', 'down' never seen in training") > warned
    assert text.index("turn 0: Character: Bob") > warned  # warned before the turn, which still plays
    # the progress line on a terminal: each stage in place (\r), then cleared before the turn's result
    progress = text[text.index("turn 0: MLLM"):text.index("turn 0: Character: Bob")]
    stages = [part.strip() for part in progress.split("\r") if part.strip()]
    assert [s.split("  ")[0] for s in stages] == ["turn 0: MLLM: the next game state", "turn 0: denoising 1/2",
                                                    "turn 0: denoising 2/2", "turn 0: decoding",
                                                    f"turn 0: first 3 frames: {tmp_path / 'turn_000.gif'}",
                                                    ]  # SpriteWorld: 3 of 9 frames first
    # the result as soon as the turn is decoded, the clip's line once it is written (in the background), before
    # the next command's output
    clip = text.index(f"  clip: {tmp_path / 'turn_000.mp4'}\n")
    assert text.index("  stamina", text.index("turn 0: Character: Bob")) < clip < text.index("commands:")
    assert f"backgrounds: {', '.join(vocabulary.backgrounds[:2])}" in text and "play ball with Luna" in text  # :help
    assert final.turns == [] and "before leaving" not in text  # undone: nothing to save


def test_new_game_dirs_never_collide(tmp_path):
    first, second = new_game_dir(tmp_path / "out"), new_game_dir(tmp_path / "out")
    assert first != second and first.is_dir() and second.is_dir() and not any(first.iterdir())


def test_play_survives_input_that_is_not_text_and_saves_on_the_way_out(tmp_path):
    """Bytes that are not UTF-8 on stdin are a line like any other (answered, not a traceback); a :save over a file
    that is not a save is refused; end of input saves the unsaved turns."""
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    command = [sys.executable, "-m", "animegamer.play", "--config", str(CONFIG), f"output_dir={tmp_path / 'out'}",
               "sampling.steps=2"]
    script = b"\n".join([TURNS[0].encode(), b"\xff\xfe\x80 run", f":save {notes}".encode()]) + b"\n"
    result = subprocess.run(command, input=script, capture_output=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = result.stdout.decode()
    assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr.decode()[-2000:]
    assert "turn 0: " in out and f"error: {notes} exists and is not an animegamer saved game" in out
    assert notes.read_text() == "keep me\n"
    game = next((tmp_path / "out").iterdir())
    assert f"turns to {game / 'game.save'} before leaving" in out
