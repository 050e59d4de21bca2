"""Writing a game's clips off the turn's critical path: one worker thread per game runs the writes one after another,
in the order they were handed over (FIFO), while the game goes on.

    writer = ClipWriter("game_1")
    pending = writer.submit(write_turn_clip, turn, frames, stem, fps)   # returns at once
    ...                                                                  # the next turn, the player reads the result
    pending.wait()                                                       # True: written; False: pending.error says why
    writer.wait()                                                        # every write handed over so far is done

A write is a plain function (the game's is :func:`animegamer.game.turn.write_turn_clip`: gif then mp4,
atomic, both or neither, the turn's paths set only once both exist). A write that raises is recorded, never
raised in the game's thread: :meth:`ClipWriter.failures` hands each failed write out once, so the game can say
so in one line.

The worker is not a daemon: it stops when its queue is empty, and an interpreter that is exiting waits for the
writes in flight before it ends, so an exit never leaves a temp file behind (only a killed process can). It
holds no reference to the game, so a game that is dropped with nothing pending leaves no thread behind.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class PendingWrite:
    """One write handed to a :class:`ClipWriter`: a future that the game waits on, or asks whether it failed."""

    def __init__(self, label: str):
        self.label = label  # what is written, for messages: "turn 3"
        self.result: Any = None  # what the write returned, once done
        self.error: BaseException | None = None  # why it failed, once done
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        """Finished, written or failed."""
        return self._done.is_set()

    @property
    def ok(self) -> bool:
        """Finished and written."""
        return self.done and self.error is None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the write has finished (at most ``timeout`` seconds); True if it was written, False if it
        failed or is still running. Ctrl-C interrupts the waiting, never the write."""
        return self._done.wait(timeout) and self.error is None

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self._done.set()


class ClipWriter:
    """A FIFO of writes run by one worker thread; the thread starts with the first write and stops when the queue
    is empty (so a game between turns holds no thread)."""

    def __init__(self, name: str = "clip-writer"):
        self.name = name
        self._lock = threading.Lock()
        self._queue: deque[tuple[PendingWrite, Callable[..., Any], tuple]] = deque()
        self._worker: threading.Thread | None = None
        self._last: PendingWrite | None = None  # the newest write: FIFO, so when it is done all are
        self._failed: list[PendingWrite] = []  # failed writes not handed out by failures() yet

    def submit(self, write: Callable[..., Any], *args: Any, label: str = "") -> PendingWrite:
        """Queue ``write(*args)`` behind every write handed over before; returns its :class:`PendingWrite` at
        once."""
        pending = PendingWrite(label)
        with self._lock:
            self._queue.append((pending, write, args))
            self._last = pending
            if self._worker is None:
                # not a daemon: an exiting interpreter waits for the write in flight (no temp file left behind)
                self._worker = threading.Thread(target=self._run, name=self.name, daemon=False)
                self._worker.start()
        return pending

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    return
                pending, write, args = self._queue.popleft()
            try:
                result = write(*args)
            except BaseException as exc:  # recorded for the game to report; the worker goes on with the next write
                with self._lock:
                    self._failed.append(pending)
                pending._finish(error=exc)
            else:
                pending._finish(result=result)

    @property
    def busy(self) -> bool:
        """Some write handed over is not finished yet."""
        last = self._last
        return last is not None and not last.done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every write handed over so far has finished (written or failed); False if ``timeout`` ran
        out first. Ctrl-C interrupts the waiting, never a write."""
        last = self._last
        return last is None or last._done.wait(timeout)

    def failures(self) -> list[PendingWrite]:
        """The writes that failed since the last call, oldest first (each is handed out once)."""
        with self._lock:
            failed, self._failed = self._failed, []
        return failed
