"""The terminal game reads a terminal or a pipe through its descriptor: lines split and decoded as a text stream
would, bad bytes as U+FFFD, and a signal handled on another thread ends the wait (a blocked read would not)."""

import io
import os
import select
import signal
import threading

import pytest

from animegamer.game.terminal import DescriptorLines, read_lines


class Stop(Exception):
    pass


@pytest.fixture
def pipe():
    read_end, write_end = os.pipe()
    yield read_end, write_end
    for fd in (read_end, write_end):
        try:
            os.close(fd)
        except OSError:
            pass


def test_lines_across_chunks_bad_bytes_and_a_last_line_without_newline(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"first\nsec")
    os.write(write_end, b"ond \xff\xfe\n\nlast")
    os.close(write_end)
    lines = DescriptorLines(read_end)
    assert [lines.readline() for _ in range(5)] == ["first\n", "second \ufffd\ufffd\n", "\n", "last", ""]
    assert lines.readline() == ""


def test_read_lines_reads_a_pipe_by_its_descriptor_and_a_script_in_memory_as_a_stream(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"Qiqi eats\n:quit\n")
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8", closefd=False) as stream:
        assert list(read_lines(stream, io.StringIO())) == ["Qiqi eats\n", ":quit\n"]
    assert list(read_lines(io.StringIO("one\ntwo"), io.StringIO())) == ["one\n", "two"]


def test_a_signal_handled_on_another_thread_ends_the_wait_and_keeps_what_was_read(pipe, monkeypatch):
    """The handler raises in the main thread, which has read half a line and waits for the rest: within the poll,
    not when the next line comes (the fallback line below comes only if the signal was never heard, and then the
    test fails)."""
    read_end, write_end = pipe
    os.write(write_end, b"half a li")
    waiting, heard = threading.Event(), threading.Event()
    real_select = select.select
    calls = []

    def select_and_say(*args):  # the second wait: the first chunk read, the pipe empty
        calls.append(args)
        if len(calls) == 2:
            waiting.set()
        return real_select(*args)

    def elsewhere():
        waiting.wait(120)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # on this thread, not the waiting one
        if not heard.wait(120):
            os.write(write_end, b"ne\n")  # unblocks a wait that never heard the signal

    def stop(signum, frame):
        raise Stop()

    monkeypatch.setattr(select, "select", select_and_say)
    before = signal.signal(signal.SIGUSR1, stop)
    lines = DescriptorLines(read_end)
    thread = threading.Thread(target=elsewhere)
    try:
        thread.start()
        with pytest.raises(Stop):
            lines.readline()
    finally:
        heard.set()
        thread.join()
        signal.signal(signal.SIGUSR1, before)
    assert waiting.is_set()
    os.write(write_end, b"ne\n")
    assert lines.readline() == "half a line\n"
