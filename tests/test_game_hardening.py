"""What a full disk, a signal, two actions at once, a long game or a killed earlier game must not do to a game: a save
that cannot be written is one line naming the file and its cause and the turns stay; a second Ctrl-C does not cut
the exit save short; one browser game runs one action at a time and a failed action leaves it as it was; a game holds
at most MAX_TURNS turns and a closed tab frees its game; a game's directory is held and cleaned of stale temp files;
the browser's status names no server path."""

import dataclasses
import gc
import io
import os
import resource
import signal
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from animegamer.game import browser as web_module
from animegamer.game import save as save_module
from animegamer.game.browser import WebGame, as_text
from animegamer.game.save import MAX_TURNS, SAVE_FORMAT, SaveError, SaveWriteError, read_save
from animegamer.game.session import GameBusy, GameSession, clean_stale_temp, sweep_stale
from animegamer.game.terminal import run
from animegamer.io import DirectoryLocked
from tests.helpers.game import GAME, FailingRenderer
from tests.helpers.gradio_app import launch

K = 2  # history_turns of tiny_overrides


@contextmanager
def file_size_limit(limit: int):
    """A real ``ulimit -f`` on this process while the block runs: a write past ``limit`` bytes fails with EFBIG
    (SIGXFSZ ignored, as the game's entry points do, instead of killing the process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def copy_game(played, folder: Path, game=None) -> GameSession:
    """A new game in ``folder`` holding the played game's two turns (unsaved)."""
    session, _ = played
    copy = GameSession(game or dataclasses.replace(session.game), output_dir=folder)
    copy.turns = [dataclasses.replace(t, clip="", gif="", writing=None) for t in session.turns]
    return copy


def no_temp(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp*"))


# ---------------------------------------------------------------------------------------------- 2: save errors


@pytest.mark.parametrize("limit", [1, 600, "half"])
def test_terminal_save_past_the_file_size_limit_is_one_line_and_the_game_goes_on(played, tmp_path, limit):
    session, save = played
    limit = save.stat().st_size // 2 if limit == "half" else limit
    game = copy_game(played, tmp_path)
    out = io.StringIO()
    target = tmp_path / "mine.save"
    with file_size_limit(limit):
        final = run(game, io.StringIO("\n".join([f":save {target}", ":state", ":quit"])), out, games_dir=tmp_path)
    text = out.getvalue()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    # :save and the autosave at :quit: each one line naming the file and the cause, no traceback
    assert len(errors) == 2, text
    assert str(target) in errors[0] and "File too large" in errors[0] and "turns are kept" in errors[0]
    assert str(tmp_path / "game.save") in errors[1] and "File too large" in errors[1]
    assert "the turn failed" not in text and "Traceback" not in text and "stamina" in text  # :state ran after it
    assert len(final.turns) == 2 and final.unsaved  # the turns in memory
    assert not target.exists() and not (tmp_path / "game.save").exists() and no_temp(tmp_path) == []
    final.save(target)  # room again: the same game saves
    assert len(read_save(target, history_turns=K).turns) == 2


@pytest.mark.parametrize("limit", [1, "half"])
def test_session_save_raises_an_oserror_naming_the_file(played, tmp_path, limit):
    session, save = played
    limit = save.stat().st_size // 2 if limit == "half" else limit
    game = copy_game(played, tmp_path)
    with file_size_limit(limit), pytest.raises(SaveWriteError) as caught:
        game.save(tmp_path / "g.save")
    assert isinstance(caught.value, OSError) and str(tmp_path / "g.save") in str(caught.value)
    assert "File too large" in str(caught.value) and "\n" not in str(caught.value)
    assert game.unsaved and no_temp(tmp_path) == []


@pytest.mark.parametrize("limit", [1, "half"])
def test_browser_save_past_the_limit_says_why_without_the_server_path(played, tmp_path, limit):
    session, save = played
    limit = save.stat().st_size // 2 if limit == "half" else limit
    web = WebGame(dataclasses.replace(session.game), tmp_path / "web")
    game = copy_game(played, Path(web.new_session().output_dir), session.game)
    with file_size_limit(limit):
        file, status = web.save(game)
    assert file is None and status.startswith("**Not saved:**") and "File too large" in status
    assert as_text("to game.save:") in status and str(tmp_path) not in status and as_text(str(tmp_path)) not in status
    assert len(game.turns) == 2 and game.unsaved and no_temp(tmp_path) == []
    file, status = web.save(game)
    assert status == "Saved 2 turns." and Path(file).is_file()


# ---------------------------------------------------------------------------------------------- 3: signals


@pytest.mark.parametrize("interrupts", [1, 3])
def test_ctrl_c_during_the_exit_save_does_not_cut_it_short(played, tmp_path, monkeypatch, interrupts):
    game = copy_game(played, tmp_path)
    real = save_module.save_file

    def interrupted_save(*args, **kwargs):  # real Ctrl-Cs (SIGINT to this process) while the save is written
        for _ in range(interrupts):
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(save_module, "save_file", interrupted_save)
    out = io.StringIO()
    final = run(game, io.StringIO(":state\n"), out, games_dir=tmp_path)  # end of input: the autosave
    text = out.getvalue()
    assert f"saved 2 turns to {tmp_path / 'game.save'} before leaving" in text
    assert "interrupted again: the game was saved first" in text and "Traceback" not in text
    assert len(read_save(tmp_path / "game.save", history_turns=K).turns) == 2 and not final.unsaved
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works as before afterwards


# ---------------------------------------------------------------------------------------------- 4: one action


class HeldRenderer(FailingRenderer):
    """The real renderer; its decode waits until ``go`` is set, after saying so on ``started``."""

    def __init__(self, renderer):
        super().__init__(renderer, None)
        self.started, self.go = threading.Event(), threading.Event()
        self.go.set()

    def decode(self, latents):
        self.started.set()
        assert self.go.wait(600), "never released"
        yield from self.renderer.decode(latents)


@pytest.mark.parametrize("second", ["undo", "save", "load", "play"])
def test_a_browser_action_while_a_turn_runs_is_refused_and_never_interleaves(played, tmp_path, second):
    session, save = played
    held = HeldRenderer(session.game.renderer)
    web = WebGame(dataclasses.replace(session.game, renderer=held), tmp_path / "web")
    game = list(web.play("Qiqi", "quickly", "run", "park", "", None))[-1][0]
    held.started.clear()
    held.go.clear()
    views = []
    turn = threading.Thread(target=lambda: views.extend(web.play("Qiqi", "", "eat", "park", "", game)))
    turn.start()
    assert held.started.wait(600)  # turn 1 is in its decoder now
    if second == "undo":
        status = web.undo(game)[1]
    elif second == "save":
        status = web.save(game)[1]
    elif second == "load":
        status = web.load(str(save), game)[1]
    else:
        status = list(web.play("Qiqi", "", "sleep", "night bedroom", "", game))[-1][1]
    assert status.startswith("**Not") and "running" in status, status
    held.go.set()
    turn.join(600)
    assert [t.index for t in game.turns] == [0, 1] and views[-1][1].startswith("Turn 1:")
    assert web.games == {id(game): game}  # the refused load made no game
    _, status = web.save(game)
    assert status.startswith("Saved 2 turns") and len(read_save(Path(game.output_dir) / "game.save",
                                                               history_turns=K).turns) == 2


@pytest.mark.parametrize("failing_call", [1, 2])
def test_a_failed_display_copy_leaves_the_game_as_it_was_and_no_turn_running(played, tmp_path, monkeypatch,
                                                                              failing_call):
    """The first frames' display copy (call 1) or the whole clip's (call 2) fails: the action ends only once its
    turn has, and takes it back."""
    session, _ = played
    web = WebGame(dataclasses.replace(session.game), tmp_path / "web")
    game = list(web.play("Qiqi", "quickly", "run", "park", "", None))[-1][0]
    files = sorted(p.name for p in Path(game.output_dir).iterdir())
    monkeypatch.setattr(session.game.renderer.decoder.vae, "num_latent_frames_batch_size", 1)  # 3 chunks
    real, calls = web_module.display_clip, []

    def failing(*args):
        calls.append(1)
        if len(calls) == failing_call:
            raise OSError(28, "No space left on device")
        return real(*args)

    monkeypatch.setattr(web_module, "display_clip", failing)
    views = list(web.play("Qiqi", "", "eat", "park", "", game))
    assert views[-1][1].startswith("**Turn failed:** OSError") and "as it was (1 turns)" in views[-1][1]
    game.wait()
    assert [t.index for t in game.turns] == [0] and not game.busy
    assert sorted(p.name for p in Path(game.output_dir).iterdir()) == files  # nothing of turn 1 stays
    monkeypatch.setattr(web_module, "display_clip", real)
    views = list(web.play("Qiqi", "", "eat", "park", "", game))  # the next turn is turn 1, once
    assert [t.index for t in game.turns] == [0, 1] and views[-1][1].startswith("Turn 1:")


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("boom"), OSError(28, "disk full")])
def test_a_failed_action_puts_the_turns_back_and_a_second_is_refused(played, tmp_path, error):
    game = copy_game(played, tmp_path)
    kept, saved = list(game.turns), list(game.saved_turns)
    with pytest.raises(type(error)), game.action("a turn"):
        game.turns.pop()
        game.turns.append(dataclasses.replace(kept[0], index=5))
        with pytest.raises(GameBusy, match="a turn is running"), game.action("undo"):
            pass
        raise error
    assert [id(t) for t in game.turns] == [id(t) for t in kept] and game.saved_turns == saved
    assert not game.busy


# ---------------------------------------------------------------------------------------------- 9: limits


@pytest.mark.parametrize("turns", [MAX_TURNS, MAX_TURNS + 3])
def test_playing_past_max_turns_is_refused_before_any_model(played, tmp_path, turns):
    game = copy_game(played, tmp_path)
    game.turns = [game.turns[0]] * turns
    game.game.renderer = game.game.predictor = None  # no model could run
    out = io.StringIO()
    run(game, io.StringIO(GAME[2] + "\n"), out, games_dir=tmp_path)
    errors = [line for line in out.getvalue().splitlines() if line.startswith("error:")]
    assert errors[0] == (f"error: the game has {turns:,} turns, the most a game holds (MAX_TURNS); save it and start "
                         "a new game to play on")
    assert len(game.turns) == turns


@pytest.mark.parametrize("count", [MAX_TURNS + 1, 100_000])
def test_a_save_over_max_turns_is_refused_before_its_tensors(played, tmp_path, count):
    _, save = played
    turn = read_save(save, history_turns=K).turns[0]
    record = {"index": 0, "instruction": turn.instruction, "values": vars(turn.values),
              "state": turn.state.to_dict(), "prompt_tokens": 1, "clip": "", "gif": ""}
    meta = {"format": SAVE_FORMAT, "seed": 1, "history_turns": K, "turns": [record] * count}
    forged = tmp_path / "long.save"
    save_file({"turn_00000": torch.zeros(2, 2)}, str(forged), metadata={"game": __import__("json").dumps(meta)})
    with pytest.raises(SaveError, match=f"turns: {count:,} turns, more than the {MAX_TURNS:,}"):
        read_save(forged, history_turns=K)


@pytest.mark.parametrize("kind", ["too-large", "fifo"])
def test_browser_upload_over_the_cap_or_not_a_file_is_refused_unread(played, tmp_path, kind):
    session, save = played
    web = WebGame(dataclasses.replace(session.game), tmp_path / "web", max_upload_bytes=save.stat().st_size - 1)
    upload = tmp_path / "upload.save"
    if kind == "fifo":
        os.mkfifo(upload)  # opening it would block forever
    else:
        upload.write_bytes(save.read_bytes())
    game, status, *_ = web.load(str(upload), None)
    assert game is None and status.startswith("**Not loaded:**") and as_text("upload.save") in status
    assert ("more than the" in status) if kind == "too-large" else ("named pipe" in status)
    assert str(tmp_path) not in status and list((tmp_path / "web").iterdir()) == []


def test_closed_tabs_leave_no_game_folder_or_tensors_behind(played, tmp_path):
    """Simulated browser sessions: each plays a turn, loads a save, and is closed; nothing per session stays."""
    session, save = played
    web = WebGame(dataclasses.replace(session.game), tmp_path / "web", upload_dir=tmp_path / "uploads")
    alive = []
    for n in range(4):
        game = list(web.play("Qiqi", "quickly", "run", "park", "", None))[-1][0]
        upload = tmp_path / "uploads" / f"hash{n}" / "g.save"
        upload.parent.mkdir(parents=True)
        upload.write_bytes(save.read_bytes())
        loaded, status, *_ = web.load(str(upload), game)  # the old game is freed, the upload removed once read
        assert status.startswith("Loaded 2 turns") and not (tmp_path / "uploads" / f"hash{n}").exists()
        alive += [weakref.ref(game), weakref.ref(loaded), weakref.ref(loaded.turns[0].shot_embeds)]
        assert list(web.games) == [id(loaded)]
        web.close(loaded)
        del game, loaded
    gc.collect()
    assert web.games == {} and list((tmp_path / "web").iterdir()) == []
    assert [ref for ref in alive if ref() is not None] == []
    assert save.is_file()  # a save that is not an upload stays where it is


# ---------------------------------------------------------------------------------------------- 10: directories


@pytest.mark.parametrize("stale", [".turn_000.k2j1.tmp.mp4", ".turn_007.x.tmp.gif", ".game.abc.tmp.save"])
def test_a_game_holds_its_directory_and_removes_stale_temp_files(played, tmp_path, stale):
    folder = tmp_path / "play_1"
    folder.mkdir()
    (folder / stale).write_bytes(b"half a clip")
    (folder / "turn_000.mp4").write_bytes(b"a clip")
    (folder / "notes.tmp").write_bytes(b"not ours")
    game = copy_game(played, folder)
    assert game.hold() == [folder / stale]
    assert sorted(p.name for p in folder.iterdir()) == [".animegamer.lock", "notes.tmp", "turn_000.mp4"]
    other = copy_game(played, folder)
    with pytest.raises(DirectoryLocked, match=f"PID {os.getpid()}"):
        other.hold()
    (folder / stale).write_bytes(b"a write in flight")
    assert sweep_stale(tmp_path, "play_*", "test") == [] and (folder / stale).exists()  # a live game's
    game.release()
    assert sweep_stale(tmp_path, "play_*", "test") == [folder / stale] and clean_stale_temp(folder) == []
    other.hold()
    other.release()


def test_a_browser_server_cleans_what_killed_tabs_left(played, tmp_path):
    session, _ = played
    for name in ("game_a1", "game_b2"):
        (tmp_path / "web" / name).mkdir(parents=True)
        (tmp_path / "web" / name / ".turn_000.zz.tmp.mp4").write_bytes(b"x")
    WebGame(dataclasses.replace(session.game), tmp_path / "web")
    assert no_temp(tmp_path / "web") == []


@pytest.mark.slow
def test_a_closed_browser_tab_frees_its_game(played, tmp_path, monkeypatch):
    """Real Gradio sessions (clients with a heartbeat, as a browser tab has): each tab that goes away is freed by the
    server's unload event, its folder removed."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from gradio_client import Client

    from animegamer.game.browser import build_app

    session, _ = played
    app = build_app(dataclasses.replace(session.game), tmp_path / "web")
    launch(app, monkeypatch)
    try:
        for _ in range(2):
            tab = Client(app.local_url, verbose=False)
            assert tab.predict("Qiqi", "quickly", "run", "park", "", api_name="/play")[0].startswith("Turn 0")
            assert len(app.web.games) == 1 and len(list((tmp_path / "web").iterdir())) == 1
            tab.close()  # the tab closes: its heartbeat ends
            deadline = time.monotonic() + 300  # the server notices at its next heartbeat check
            # the game leaves the open games first, then its last action ends and its folder goes: wait for both
            while (app.web.games or any((tmp_path / "web").iterdir())) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert app.web.games == {} and list((tmp_path / "web").iterdir()) == []
    finally:
        app.close()
