"""Play AnimeGamer in the terminal: type an instruction, get the clip and the state bars.

    make play                                                                   # the shipped SpriteWorld world
    python -m animegamer.play --config configs/spriteworld/inference.yaml      # the same
    python -m animegamer.play --config configs/inference.yaml                  # full size (converted weights)

Instructions are free text or ``Character: Qiqi; Motion: happily eat; Background: morning kitchen.``; ``:help``
lists the commands and the world's characters, adverbs, motions and backgrounds (the checkpoint's
vocabulary.json), and words the model never saw in training are pointed out before the turn runs. Every game
writes into a new directory under ``output_dir``; leaving with unsaved turns saves them there (``game.save``),
however the game ends. ``:load`` saves the current game's unsaved turns the same way first, and the loaded game
plays in a new directory of its own. ``:save FILE`` replaces only an earlier saved game. A turn that fails (for any
reason), a save that cannot be loaded and Ctrl-C during a turn each print one line and keep the game exactly as it
was; Ctrl-C at the prompt does not leave the game either (``:quit`` or end of input does).

A turn's result (its values and the character's bars) is printed as soon as the turn is decoded; its clip is
written in the background and its ``clip:`` line follows when it is written, before the next prompt (a clip that
could not be written is one ``error:`` line, and the turn stays played).

A game that ends because its terminal hung up (SIGHUP) or it was told to stop (SIGTERM) saves its unsaved turns as
at end of input; Ctrl-C while the game is being saved at its end does not cut the save short. A save that cannot be
written (a full disk, a file size limit) is one line naming the file and the cause, and the game goes on with its
turns in memory. Each game holds its directory for as long as it runs (a second game is refused there), and a new
game removes the temp files that killed earlier games left in the other games' directories.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from animegamer.cli import no_bars_in_logs, parse_config, reports_usage_errors
from animegamer.config import InferenceConfig
from animegamer.data.vocabulary import Vocabulary
from animegamer.game.build import build_session, prepare_play
from animegamer.game.session import SAVE_NAME, GameSession, one_line, shielded, sweep_stale
from animegamer.game.turn import QUIET, Turn, TurnEvents
from animegamer.states import state_bar

GAME_COMMAND = "python -m animegamer.play"  # what a game's directory lock names as its holder


class HangUp(BaseException):
    """The terminal hung up (SIGHUP) or the game was told to stop (SIGTERM): the game ends as at end of input.
    Not an Exception, so that no command's error handling takes it for a failed command."""


class Ending:
    """Whether the game is ending (its clips being written and its turns saved): a hang-up then changes nothing."""

    now = False


def hang_up(signum, frame) -> None:
    """SIGHUP and SIGTERM while the game is played end it as end of input would; once it is ending, nothing."""
    if not Ending.now:
        raise HangUp(signal.Signals(signum).name)


class Quiet:
    """The game's output once its terminal is gone: lines written to it that cannot be are dropped (EIO), so that
    the game still saves."""

    def __init__(self, out: TextIO):
        self.out = out

    def write(self, text: str) -> int:
        try:
            return self.out.write(text)
        except (OSError, ValueError):  # EIO from a hung-up terminal, a closed stream
            return len(text)

    def flush(self) -> None:
        try:
            self.out.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return False

HELP = """commands:
  <instruction>      play a turn (free text or 'Character: …; Motion: …; Background: ….')
  :save [FILE]       save the game (default: game.save in this game's directory); replaces only a saved game
  :load FILE         continue a saved game, in a new directory (this game's unsaved turns are saved first)
  :undo              take back the last turn
  :state             show the character's bars
  :help              this text
  :quit              leave"""


def show_state(session: GameSession, out: TextIO) -> None:
    state = session.state
    for name in ("stamina", "social", "entertainment"):
        print("  " + state_bar(name, getattr(state, name)), file=out)


def new_game_dir(output_dir: str | Path) -> Path:
    """A new directory for one game, ``<output_dir>/play_<date>-<time>[-n]``: a game never overwrites the clips of
    another."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    stem = time.strftime("play_%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        folder = root / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{root}: no free name for a new game directory ({stem}-N)")


class ProgressLine(TurnEvents):
    """The terminal's view of a running turn: one status line, rewritten in place (MLLM, denoising steps,
    decoding, the first frames' gif as soon as it is written) and cleared at the end; only on a terminal, so a log
    file gets the turn's results and no progress clutter."""

    early_gif = True  # a terminal shows files: the first frames go to the turn's gif, and the line names it

    def __init__(self, out: TextIO, prefix: str):
        self.out, self.prefix, self.width, self.start = out, prefix, 0, time.monotonic()

    def stage(self, what: str, done: float) -> None:
        text = f"{self.prefix}{what}  {100 * done:3.0f}%  ({time.monotonic() - self.start:.0f} s)"
        self.out.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.out.flush()

    def clear(self) -> None:
        if self.width:
            self.out.write("\r" + " " * self.width + "\r")
            self.out.flush()


def _isatty(stream) -> bool:
    return bool(getattr(stream, "isatty", None) and stream.isatty())


POLL_S = 0.25  # how often a game waiting for a line looks for a signal another thread of the process received


def _descriptor(lines) -> int | None:
    """The file descriptor ``lines`` reads, when reading it can block (a terminal, a pipe, a socket); None for a
    regular file or a stream without one (a script in memory)."""
    try:
        fd = lines.fileno()
        return None if stat.S_ISREG(os.fstat(fd).st_mode) else fd
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return None


class DescriptorLines:
    """The lines read from a file descriptor, decoded with bad bytes as U+FFFD. A kernel may hand SIGTERM or Ctrl-C
    to any of the process's threads (torch's among them), and then a blocked read in the main thread, the only one
    where Python runs signal handlers, would never return: so the wait is a poll that wakes every :data:`POLL_S`
    seconds, and a signal received anywhere is handled within that. A signal's exception raised while waiting
    leaves what was read kept for the next line."""

    def __init__(self, fd: int, encoding: str = "utf-8"):
        self.fd, self.encoding = fd, encoding
        self.pending = b""
        self.ended = False

    def readline(self) -> str:
        """The next line with its newline, the last one without, "" at end of input; OSError (EIO: the terminal
        hung up) is the caller's."""
        while (end := self.pending.find(b"\n")) < 0 and not self.ended:
            while not select.select([self.fd], [], [], POLL_S)[0]:
                pass
            chunk = os.read(self.fd, 65536)
            self.ended = not chunk
            self.pending += chunk
        cut = end + 1 if end >= 0 else len(self.pending)  # at end of input: what is left, "" when nothing is
        line, self.pending = self.pending[:cut], self.pending[cut:]
        return line.decode(self.encoding, errors="replace")


def read_lines(lines: TextIO, out: TextIO, prompt=None) -> Iterator[str]:
    """The player's lines until end of input, after ``prompt()`` on a terminal; Ctrl-C while waiting for one prints
    a hint instead of leaving (leaving would lose the unsaved turns). A terminal or a pipe is read through its file
    descriptor (:class:`DescriptorLines`: a signal is heard while waiting), so nothing may have read from ``lines``
    before."""
    fd = _descriptor(lines)
    source = DescriptorLines(fd, getattr(lines, "encoding", None) or "utf-8") if fd is not None else lines
    while True:
        if prompt is not None:
            out.write(prompt())
            out.flush()
        try:
            raw = source.readline()
        except KeyboardInterrupt:
            print("\ninterrupted: type :quit to leave (unsaved turns are saved first)", file=out)
            continue
        except OSError:  # EIO: the terminal hung up (its SIGHUP may come a moment later); as end of input
            return
        if not raw:
            return
        yield raw


def failure(exc: BaseException, line: str, turns: int) -> str:
    """The one line saying why a command did not happen: Ctrl-C, a bad instruction or file (ValueError, IndexError,
    OSError), or anything else that failed in a model (a GPU out of memory, a setting that breaks the sampler)."""
    if isinstance(exc, KeyboardInterrupt):
        return f"\ninterrupted: {line[:60]!r} cancelled; the game is as it was ({turns} turns)"
    if isinstance(exc, (ValueError, IndexError, OSError)):
        return f"error: {one_line(exc)}"
    if line.startswith(":"):  # a command that is not a turn (a save, a load) failed in something else
        return f"error: {line.split()[0]} failed ({type(exc).__name__}: {one_line(exc)}); the game is as it was " \
               f"({turns} turns)"
    return f"error: the turn failed ({type(exc).__name__}: {one_line(exc)}); the game is as it was ({turns} turns)"


def settle(session: GameSession, out: TextIO) -> None:
    """Wait for the clips being written and say which could not be (one ``error:`` line each)."""
    session.wait()
    for failure in session.clip_failures():
        print(f"error: {failure}", file=out)


def report_clip(session: GameSession, turn: Turn, out: TextIO) -> None:
    """The line of a turn's clip once it is written (in the background), or why it could not be; Ctrl-C while
    waiting leaves the turn played and its clip being written."""
    try:
        settle(session, out)
    except KeyboardInterrupt:
        print(f"\ninterrupted: turn {turn.index} is played; its clip is still being written", file=out)
        return
    if turn.clip:
        print(f"  clip: {turn.clip}", file=out)


def autosave(session: GameSession, out: TextIO, why: str = "before leaving", wait: bool = True) -> bool:
    """Unsaved turns are saved to the game's directory instead of being lost; False when they could not be (one
    ``error:`` line naming the file and the cause). ``wait=False`` saves without waiting for the clips being
    written (after Ctrl-C interrupted the waiting)."""
    if not (session.unsaved and session.turns):
        return True
    folder = Path(session.output_dir)
    # game.save, or beside it when something that is not a save sits there (a save replaces only a save)
    for path in [folder / SAVE_NAME, *(folder / f"game-{n}.save" for n in range(2, 10))]:
        try:
            session.save(path, wait=wait)
        except ValueError as exc:
            refused = exc
            continue
        except OSError as exc:  # a full disk, a file size limit, a folder gone (SaveWriteError names the file)
            refused = exc
            break
        print(f"saved {len(session.turns)} turns to {path} {why} (continue with :load {path})", file=out)
        return True
    print(f"error: could not save the game {why}: {one_line(refused)}", file=out)
    return False


def load_game(session: GameSession, file: str, games_dir: Path, out: TextIO) -> GameSession:
    """The saved game in ``file``, continued in a new directory under ``games_dir`` (its clips and autosave never
    touch the current game's); the current game's unsaved turns are saved first. A save that cannot be loaded,
    or a current game that cannot be saved, raises ValueError/OSError and changes nothing."""
    loaded = GameSession.load(file, session.game, output_dir=games_dir)
    settle(session, out)
    if not autosave(session, out, "before loading"):
        raise ValueError(f"{file} not loaded: the current game's unsaved turns could not be saved")
    loaded.output_dir = new_game_dir(games_dir)
    if session.holding:  # the current game held its directory: the loaded one holds its own
        loaded.hold(GAME_COMMAND)
        session.release()
    return loaded


def do_command(session: GameSession, command: str, arg: str, line: str, games_dir: Path, out: TextIO,
               vocabulary: Vocabulary | None) -> Turn | GameSession | None:
    """One command of :func:`run` (not ``:quit``): the turn it played (its clip being written), the game it
    loaded, or None."""
    if command == ":help":
        print(HELP, file=out)
        if vocabulary:
            print("the words this world was trained on:\n" + vocabulary.describe(), file=out)
    elif command == ":state":
        show_state(session, out)
    elif command == ":undo":
        turn = session.undo()
        print(f"undid turn {turn.index}: {turn.instruction}", file=out)
        show_state(session, out)
    elif command == ":save":
        path = session.save(arg.strip() or Path(session.output_dir) / SAVE_NAME)
        print(f"saved {len(session.turns)} turns to {path}", file=out)
    elif command == ":load":
        if not arg.strip():
            raise ValueError(":load needs a file")
        loaded = load_game(session, arg.strip(), games_dir, out)
        print(f"loaded {len(loaded.turns)} turns from {arg.strip()}; its clips go to {loaded.output_dir}", file=out)
        show_state(loaded, out)
        return loaded
    elif command.startswith(":"):
        print(f"unknown command {command}; type :help", file=out)
    else:
        for warning in vocabulary.unknown_words(line) if vocabulary else []:
            print(f"warning: {warning}; the model will guess", file=out)
        progress = ProgressLine(out, f"turn {len(session.turns)}: ") if _isatty(out) else QUIET
        try:
            turn = session.play(line, progress)
        finally:
            if isinstance(progress, ProgressLine):
                progress.clear()
        v = turn.values
        print(f"turn {turn.index}: {turn.instruction}", file=out)
        print(f"  motion level {v.motion_level}  social {v.social}  entertainment {v.entertainment}  "
              f"stamina {v.stamina:+d}", file=out)
        show_state(session, out)
        out.flush()  # the result is on screen while the clip is written
        return turn
    return None


def run(session: GameSession, lines: TextIO, out: TextIO, vocabulary: Vocabulary | None = None,
        games_dir: str | Path | None = None) -> GameSession:
    """The read-eval loop over ``lines`` (stdin or a script); returns the session as it ends. However it ends
    (``:quit``, end of input, an error it cannot go on after), unsaved turns are saved first (:func:`autosave`).

    On a terminal a prompt waits for each line and a progress line shows the running turn; ``vocabulary`` (the
    checkpoint's) feeds ``:help``, the example of the empty-line hint and the warnings about unknown words. A
    loaded game plays in a new directory under ``games_dir`` (default: beside the current game's)."""
    games_dir = Path(games_dir) if games_dir is not None else Path(session.output_dir).parent
    example = vocabulary.placeholder() if vocabulary else "Character: Qiqi; Motion: happily eat; Background: park."
    print(f"AnimeGamer: {len(session.turns)} turns so far; clips go to {session.output_dir}. "
          "Type an instruction, or :help.", file=out)
    prompt = (lambda: f"turn {len(session.turns)}> ") if _isatty(lines) and _isatty(out) else None
    Ending.now = False
    try:
        for raw in read_lines(lines, out, prompt):
            line = raw.strip()
            if not line:
                print(f"type what the character does next, e.g. {example}  (:help lists the commands and words)",
                      file=out)
                continue
            command, _, arg = line.partition(" ")
            before = session  # what a failed or interrupted command restores (a :load replaces the session)
            played = None  # the turn this command played: its clip is being written
            try:
                with session.action(command if command.startswith(":") else "a turn"):  # failed: turns as before
                    if command == ":quit":
                        break
                    played = do_command(session, command, arg, line, games_dir, out, vocabulary)
                    if isinstance(played, GameSession):
                        session, played = played, None
            except (KeyboardInterrupt, Exception) as exc:  # the command did not happen; the game goes on
                session, played = before, None
                print(failure(exc, line, len(session.turns)), file=out)
            if played is not None:  # before the next prompt, so that a log reads in the same order every time
                report_clip(session, played, out)
            out.flush()
    except HangUp:  # the terminal is gone (or SIGTERM): end as at end of input, printing what still can be
        out = Quiet(out)
        print("\nhang-up: the game ends", file=out)
    finally:  # however the game ends, its clips are written and its unsaved turns are kept
        # first, and by a plain store (no call, so no signal handler runs before it): from here on a hang-up or
        # SIGTERM (which comes after EIO on input when the terminal closes) changes nothing
        Ending.now = True
        out = out if isinstance(out, Quiet) else Quiet(out)  # a terminal that hung up must not stop the save
        waited = True
        try:
            settle(session, out)
        except KeyboardInterrupt:  # the writes go on (and end before the process does); don't wait for them
            print("\ninterrupted: saving without waiting for the clips being written", file=out)
            waited = False
        with shielded() as heard:  # a second Ctrl-C must not cut the save short
            autosave(session, out, wait=waited)
        if heard:
            print("interrupted again: the game was saved first", file=out)
        session.release()
    return session


@reports_usage_errors
def main(argv: list[str] | None = None, build: Callable[[InferenceConfig], GameSession] = build_session) -> None:
    """``build``: the game's builder (an entry point that plays other parts passes its own)."""
    cfg, _ = parse_config(InferenceConfig, __doc__, argv)
    no_bars_in_logs()
    vocabulary, session = prepare_play(cfg, build)  # a bad setting, weights path or vocabulary: one line, no model
    # a file size limit (ulimit -f) fails the write that reaches it (one line) instead of killing the game unsaved
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for number in (signal.SIGHUP, signal.SIGTERM):  # the terminal closed, or docker/systemd stopping the game
        signal.signal(number, hang_up)
    sweep_stale(cfg.output_dir, "play_*", GAME_COMMAND)
    session.output_dir = new_game_dir(cfg.output_dir)
    session.hold(GAME_COMMAND)
    if hasattr(sys.stdin, "reconfigure"):  # bytes that are not text become U+FFFD: a line answered, not a crash
        sys.stdin.reconfigure(errors="replace")
    run(session, sys.stdin, sys.stdout, vocabulary)
    try:
        sys.stdout.flush()
    except OSError:  # the terminal hung up: what is left to print goes nowhere, rather than failing the exit
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, sys.stdout.fileno())
        os.dup2(quiet, sys.stderr.fileno())
