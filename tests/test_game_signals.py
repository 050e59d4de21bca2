"""The games as real processes meet real signals: a terminal that hangs up (a real pseudo-terminal closed) or SIGTERM
(to the process, or handled on one of its worker threads) saves the terminal game like end of input; the browser
server on SIGTERM or Ctrl-C saves every tab's unsaved turns, leaves no temp file and exits 0. The shipped
SpriteWorld world (no weights to build)."""

import ctypes
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from safetensors import safe_open

from animegamer.game.save import is_save
from tests.helpers.stage_scripts import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "spriteworld" / "inference.yaml"
TURN = "Character: Qiqi; Motion: happily eat; Background: morning kitchen."
TIMEOUT = 600  # generous: the machine may be busy; every wait below ends on an event, not on the clock
pytestmark = pytest.mark.slow


def read_until(fd: int, marker: bytes, seen: bytearray) -> None:
    """Read the terminal's output into ``seen`` until ``marker`` appears in it."""
    deadline = time.monotonic() + TIMEOUT
    while marker not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {marker!r} in {bytes(seen)[-2000:]!r}"
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side is gone
            chunk = b""
        assert chunk, f"the game ended before {marker!r}: {bytes(seen)[-2000:]!r}"
        seen += chunk


def saved_instructions(save: Path) -> list[str]:
    """The instructions of a saved game (whatever K it was played with)."""
    assert is_save(save), save
    with safe_open(str(save), framework="numpy") as fh:
        return [turn["instruction"] for turn in json.loads(fh.metadata()["game"])["turns"]]


def controlling_terminal():
    """In the child: a session of its own whose controlling terminal is its stdin (the pty), as a shell's game."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def send_to_a_worker_thread(pid: int, number: int) -> None:
    """``number`` to one of the game's threads that is not its main thread, as the kernel may route a SIGTERM
    (glibc's tgkill)."""
    others = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
    assert others, "the game runs no thread but its main one"
    assert ctypes.CDLL(None, use_errno=True).tgkill(pid, others[-1], number) == 0, ctypes.get_errno()


@pytest.mark.parametrize("how", ["hang-up", "sigterm", "sigterm-on-a-worker-thread"])
def test_the_terminal_game_saves_when_its_terminal_hangs_up_or_it_is_stopped(tmp_path, how):
    master, slave = os.openpty()
    command = [sys.executable, "-m", "animegamer.play", "--config", str(CONFIG), f"output_dir={tmp_path}",
               "sampling.steps=2"]
    game = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT,
                            preexec_fn=controlling_terminal, env={**os.environ, "OMP_NUM_THREADS": "1"})
    os.close(slave)
    seen = bytearray()
    try:
        read_until(master, b"turn 0> ", seen)
        os.write(master, TURN.encode() + b"\n")
        read_until(master, b"turn 1> ", seen)  # played, its clip written; waiting for the next line
        if how == "hang-up":
            os.close(master)  # the terminal window closes: the kernel sends the game SIGHUP
            master = None
        elif how == "sigterm":
            game.send_signal(signal.SIGTERM)
        else:  # handled on a thread that is not the one waiting for the line: the game hears it all the same
            send_to_a_worker_thread(game.pid, signal.SIGTERM)
        assert game.wait(TIMEOUT) == 0, bytes(seen)[-2000:]
    finally:
        if game.poll() is None:
            game.kill()
        if master is not None:
            os.close(master)
    folders = [p for p in tmp_path.iterdir() if p.name.startswith("play_")]
    assert len(folders) == 1
    assert saved_instructions(folders[0] / "game.save") == [TURN]
    assert sorted(p.name for p in folders[0].glob(".*.tmp*")) == []
    assert (folders[0] / "turn_000.mp4").is_file()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_browser_server_saves_every_tab_and_exits_0_when_stopped(tmp_path, stop):
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from gradio_client import Client

    port = free_port()
    games, cache = tmp_path / "games", tmp_path / "gradio"  # the tabs' folders; Gradio's copies of what it served
    command = [sys.executable, "app.py", "--config", str(CONFIG), f"output_dir={games}", "sampling.steps=2",
               "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False",
                                   "GRADIO_TEMP_DIR": str(cache)})
    try:
        lines = []
        while not any("open http" in line for line in lines):
            line = server.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        tabs = [Client(f"http://127.0.0.1:{port}/", verbose=False) for _ in range(2)]
        for n, tab in enumerate(tabs):
            for _ in range(n + 1):  # tab 0 plays one turn, tab 1 two
                assert tab.predict("Qiqi", "happily", "eat", "morning kitchen", "", api_name="/play")[0] \
                    .startswith("Turn")
        server.send_signal(stop)
        out, _ = server.communicate(timeout=TIMEOUT)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, out
    assert "Traceback" not in out
    saves = sorted(len(saved_instructions(p)) for p in games.glob("game_*/game.save"))
    assert saves == [1, 2], out
    assert [p.name for p in games.rglob(".*.tmp*")] == []
    assert [p for p in cache.rglob("*") if p.is_file()] == []  # the served clips' copies deleted as it stopped
    for folder in games.glob("game_*"):  # each save named in one line
        assert f"saved {len(saved_instructions(folder / 'game.save'))} turns to {folder / 'game.save'}" in out
