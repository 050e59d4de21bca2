"""GameSession: a game being played: its turns, undo, save and load, each turn played by
:meth:`animegamer.game.turn.AnimeGamer.play_turn` (the one game loop of the terminal and browser games).

    session = GameSession(game, output_dir="outputs/play")      # game: build_game(cfg)
    turn = session.play("Character: Qiqi; Motion: gently lie down; Background: night bedroom.")
    session.save("outputs/play/qiqi.game")            # one atomic file: states, instructions, s_a
    session = GameSession.load("outputs/play/qiqi.game", game)

Each turn's decoder seed is derived from (session seed, turn index), so a loaded game continues exactly as the
original would have. A save is untrusted input when loaded (:mod:`animegamer.game.save`): every field is
checked and its clip paths are never opened.

A session writes its clips off the turn's critical path (its :class:`ClipWriter`, one thread, in turn order):
``play`` returns as soon as the turn's frames are decoded, and ``turn.clip`` is set once the clip is written
(``turn.wait_clip()``, ``session.wait()``). Whatever needs the files waits for the writes first: undo, save, and
rendering a turn again; :meth:`GameSession.clip_failures` says which clips could not be written (the turns stay
played). ``GameSession(..., writer=None)`` writes each clip before ``play`` returns.

One action at a time: :meth:`GameSession.action` holds a game for one command (a turn, undo, save, load); a second
one while it runs is refused (:class:`GameBusy`), and a command that fails in any way leaves the turns exactly as they
were (the clips of turns it added removed). A game holds its own directory (:meth:`GameSession.hold`: a
:func:`~animegamer.io.directory_lock`, so two games never write into one), and taking it removes the temp files a
killed earlier game left there. A game holds at most :data:`~animegamer.game.save.MAX_TURNS` turns.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from animegamer.game.clip_writer import ClipWriter
from animegamer.game.save import (
    MAX_HISTORY_TURNS,
    MAX_SEED,
    MAX_TURNS,
    check_save_target,
    read_save,
    write_save,
)
from animegamer.game.turn import QUIET, AnimeGamer, Turn, TurnEvents
from animegamer.io import DirectoryLocked, directory_lock
from animegamer.states import CharacterState

SAVE_NAME = "game.save"  # a game's default save file, inside its own output directory
STALE_TEMP = ".*.tmp*"  # what atomic writes leave behind when their process is killed: ``.turn_000.x8f2.tmp.mp4``


class GameBusy(RuntimeError):
    """Another action of the same game is running (:meth:`GameSession.action`); nothing was done."""


def clean_stale_temp(folder: str | Path) -> list[Path]:
    """Remove the temp files (:data:`STALE_TEMP`) a killed earlier game left in ``folder``; only safe while holding
    the folder's :func:`~animegamer.io.directory_lock` (a live game's temp files are its writes in flight)."""
    removed = []
    for path in Path(folder).glob(STALE_TEMP):
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def sweep_stale(output_dir: str | Path, pattern: str, command: str) -> list[Path]:
    """Remove the temp files that killed games left in the game directories ``output_dir/<pattern>``; a directory
    a running game holds is left alone (its lock is taken only for the cleaning). Returns the files removed."""
    removed = []
    for folder in sorted(Path(output_dir).glob(pattern)):
        if not folder.is_dir() or folder.is_symlink() or not any(folder.glob(STALE_TEMP)):
            continue
        try:
            with directory_lock(folder, f"{command} (removing stale temp files)"):
                removed += clean_stale_temp(folder)
        except (DirectoryLocked, OSError):  # a running game's, or not ours to write in
            continue
    return removed


@contextmanager
def shielded(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> Iterator[list[int]]:
    """Run a block that must not be cut short (saving a game as a program ends): ``signals`` arriving meanwhile
    are noted in the yielded list instead of raising (Ctrl-C) or ending the process (SIGTERM, SIGHUP), and their
    handlers are restored afterwards. Outside the main thread (where Python runs signal handlers) it only yields."""
    heard: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield heard
        return
    before = {}
    for number in signals:
        before[number] = signal.signal(number, lambda signum, frame: heard.append(signum))
    try:
        yield heard
    finally:
        for number, handler in before.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)


def one_line(exc: BaseException) -> str:
    """An error as one line of at most 300 characters (a CUDA out-of-memory message spans several)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def check_game_settings(seed: int, history_turns: int) -> None:
    """A game's seed and history window K, in the ranges its save holds: ValueError naming the setting."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed={seed} must be an integer in 0..{MAX_SEED} (a save holds no other)")
    if isinstance(history_turns, bool) or not isinstance(history_turns, int) \
            or not 0 <= history_turns <= MAX_HISTORY_TURNS:
        raise ValueError(f"history_turns={history_turns} must be an integer in 0..{MAX_HISTORY_TURNS}")


@dataclass
class GameSession:
    game: AnimeGamer  # its seed is this game's (a loaded game plays on a copy with the save's seed)
    output_dir: str | Path = "outputs/play"
    turns: list[Turn] = field(default_factory=list)
    # the turns as last saved or loaded: the game has unsaved changes when they differ (same Turn objects or not)
    saved_turns: list[Turn] = field(default_factory=list, repr=False)
    # writes the clips in the background, in turn order (None: each clip is written before play returns)
    writer: ClipWriter | None = field(default_factory=ClipWriter, repr=False, compare=False)
    # one action at a time (action()); a plain Lock: a browser's turn may end in another thread than it began
    _busy: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _doing: str = field(default="", init=False, repr=False, compare=False)
    _hold: ExitStack | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        # what a game accepts its save must hold (animegamer.game.save), so it is refused here, not at :load
        check_game_settings(self.seed, self.history_turns)

    @property
    def seed(self) -> int:
        return self.game.seed

    @property
    def history_turns(self) -> int:
        return self.game.history_turns

    @property
    def unsaved(self) -> bool:
        """Turns played or undone since the last save or load."""
        return [id(t) for t in self.turns] != [id(t) for t in self.saved_turns]

    @property
    def state(self) -> CharacterState:
        """The character's state now."""
        return self.turns[-1].state if self.turns else CharacterState()

    def play(self, instruction: str, events: TurnEvents = QUIET) -> Turn:
        """The next turn (:meth:`AnimeGamer.play_turn`), its clip written to this session's output directory, in
        the background with a writer (the turn returns once its frames are decoded); ``events`` hears the turn as
        it runs (:class:`~animegamer.game.turn.TurnEvents`). A game of :data:`MAX_TURNS` turns plays no more
        (ValueError: a save holds no more)."""
        if len(self.turns) >= MAX_TURNS:
            raise ValueError(f"the game has {len(self.turns):,} turns, the most a game holds (MAX_TURNS); save it "
                             "and start a new game to play on")
        turn = self.game.play_turn(self.turns, instruction, out_dir=self.output_dir, events=events,
                                   writer=self.writer)
        self.turns.append(turn)
        return turn

    def render_turn(self, turn: Turn, events: TurnEvents = QUIET):
        """Render ``turn``'s clip again into this session's output directory (a loaded game's last turn), once the
        clips being written are (the same turn's among them); returns its frames (T, H, W, 3) uint8, or None
        without a decoder."""
        if self.game.renderer is None:
            return None
        self.wait()
        return self.game.render_turn(turn, self.output_dir, events=events, writer=self.writer)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every clip handed to the writer is written or has failed (:meth:`clip_failures`); False if
        ``timeout`` ran out first. Ctrl-C interrupts the waiting, never a write."""
        return self.writer is None or self.writer.wait(timeout)

    def clip_failures(self) -> list[str]:
        """One line for each clip whose background write failed since the last call (without waiting): neither of
        its files exists and its turn stays played (its shot and state are the game; the clip can be rendered
        again)."""
        if self.writer is None:
            return []
        return [f"the clip of {failed.label} was not written ({type(failed.error).__name__}: "
                f"{one_line(failed.error)}); the turn is played without it" for failed in self.writer.failures()]

    def undo(self) -> Turn:
        """Take back the last turn, once its clip is written, and remove its clip (mp4 and gif)."""
        if not self.turns:
            raise IndexError("nothing to undo")
        self.wait()
        turn = self.turns.pop()
        self.remove_clip(turn)
        return turn

    def remove_clip(self, turn: Turn) -> None:
        """Remove ``turn``'s clip files once the clips being written are, and clear its paths (a turn taken
        back, or played by a command that was then interrupted)."""
        self.wait()
        paths, turn.clip, turn.gif = [turn.clip, turn.gif], "", ""
        for path in paths:
            if path:
                Path(path).unlink(missing_ok=True)

    def save(self, path: str | Path, wait: bool = True) -> Path:
        """One atomic, fsynced safetensors file: the shots as tensors, everything else as JSON metadata
        (format in :mod:`animegamer.game.save`). It replaces only an earlier save (:func:`check_save_target`)
        and keeps that file's permissions. It waits for the clips being written first, so that the save names
        them (``wait=False``: a clip still being written is saved without its path, which a load never reads)."""
        mode = check_save_target(path)
        if wait:
            self.wait()
        write_save(path, self.seed, self.history_turns, self.turns, mode)
        self.saved_turns = list(self.turns)
        return Path(path)

    @contextmanager
    def action(self, what: str, wait: float = 0) -> Iterator[GameSession]:
        """Hold this game for one action (``what``: "a turn", "undo", ...). A second action while one runs raises
        :class:`GameBusy` (at once, or after waiting ``wait`` seconds for it) and changes nothing. If the block
        fails in any way (Ctrl-C included), the turns and the saved mark are put back as they were and the clips
        of turns it added are removed, once written."""
        if not (self._busy.acquire(timeout=wait) if wait > 0 else self._busy.acquire(blocking=False)):
            raise GameBusy(f"{self._doing or 'another action'} is running in this game; try again when it has "
                           "finished")
        self._doing = what
        turns, saved = list(self.turns), list(self.saved_turns)
        try:
            yield self
        except BaseException:
            added = [t for t in self.turns if all(t is not kept for kept in turns)]
            self.turns[:], self.saved_turns[:] = turns, saved
            for turn in added:
                self.remove_clip(turn)
            raise
        finally:
            self._doing = ""
            self._busy.release()

    @property
    def busy(self) -> bool:
        """An action is running (:meth:`action`)."""
        return self._busy.locked()

    def hold(self, command: str = "an animegamer game") -> list[Path]:
        """Hold this game's output directory for this process (:func:`~animegamer.io.directory_lock`: another game
        there is refused with ``DirectoryLocked`` naming its holder), and remove the temp files a killed earlier
        game left there; returns them. :meth:`release` (or :meth:`close`) lets it go."""
        self.release()
        stack = ExitStack()
        stack.enter_context(directory_lock(self.output_dir, command))
        self._hold = stack
        return clean_stale_temp(self.output_dir)

    @property
    def holding(self) -> bool:
        """This game holds its output directory (:meth:`hold`)."""
        return self._hold is not None

    def release(self) -> None:
        """Let go of the output directory :meth:`hold` took (nothing if none)."""
        if self._hold is not None:
            self._hold.close()
            self._hold = None

    def close(self) -> None:
        """Done with this game: its clips written, its directory let go, its turns (and their shot tensors)
        dropped."""
        self.wait()
        self.release()
        self.turns.clear()
        self.saved_turns.clear()

    @classmethod
    def load(cls, path: str | Path, game: AnimeGamer, output_dir: str | Path | None = None) -> GameSession:
        """A saved game, checked as untrusted input (:func:`animegamer.game.save.read_save`), continued by
        ``game`` (a save played with another K than ``game.history_turns`` is refused, so that the game goes on
        exactly as it would have). Clip paths in the save are dropped: :meth:`render_turn` makes a turn's clip
        again, inside ``output_dir``. Raises ValueError naming the file and field, or FileNotFoundError."""
        path = Path(path)
        if path.is_dir():
            inside = path / SAVE_NAME
            hint = f"; its saved game is {inside}" if inside.is_file() else ""
            raise ValueError(f"{path} is a directory, not a saved game file{hint}")
        predictor = game.predictor
        saved = read_save(
            path,
            history_turns=game.history_turns,
            shot_shape=predictor.shot_shape if predictor is not None else None,
            validate_instruction=predictor.validate if predictor is not None else None,
            max_instruction_chars=game.max_instruction_chars,
        )
        session = cls(dataclasses.replace(game, seed=saved.seed),
                      output_dir=output_dir if output_dir is not None else path.parent)
        session.turns = [Turn(t.index, t.instruction, t.values, t.state, t.shot_embeds, t.prompt_tokens)
                         for t in saved.turns]
        session.saved_turns = list(session.turns)
        return session
