"""animegamer.io: atomic writes keep the umask's mode, are fsynced before the rename, and paths stay inside."""

import os
import tempfile
from pathlib import Path

import pytest

from animegamer import io as agio
from animegamer.io import atomic_path, atomic_write_text, path_inside


@pytest.fixture
def umask():
    """Set the process umask for one test, restored afterwards."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_get_the_umask_mode(tmp_path, umask, mask, mode):
    umask(mask)
    assert agio.current_umask() == mask
    atomic_write_text(tmp_path / "a.txt", "hello")
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == mode
    assert (tmp_path / "a.txt").read_text() == "hello"


def test_file_and_directory_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = agio.fsync_path, os.replace

    def spy_fsync(path):
        events.append(("fsync", "dir" if os.path.isdir(path) else "file"))
        real_fsync(path)

    def spy_replace(src, dst):
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(agio, "fsync_path", spy_fsync)
    monkeypatch.setattr(agio.os, "replace", spy_replace)
    atomic_write_text(tmp_path / "b.json", "{}")
    assert events == [("fsync", "file"), ("replace", "b.json"), ("fsync", "dir")]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    atomic_write_text(tmp_path / "c.txt", "old")
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "c.txt") as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert (tmp_path / "c.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["c.txt"]


def test_an_interrupt_just_after_the_temp_file_is_created_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C raises KeyboardInterrupt at whatever line runs; the first moment the temp file exists on disk is the
    earliest it can land, and it must still be cleaned up (a stage (b) run interrupted while writing its
    missing-targets report left one)."""
    atomic_write_text(tmp_path / "d.txt", "old")
    real_open = os.open

    def open_then_interrupt(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_CREAT:
            os.close(fd)
            raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(agio.os, "open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(tmp_path / "d.txt", "new")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["d.txt"] and (tmp_path / "d.txt").read_text() == "old"


def test_a_temp_name_in_the_way_is_skipped_not_touched(tmp_path, monkeypatch):
    tokens = iter(["takentak", "freefree"])
    monkeypatch.setattr(agio, "_temp_token", lambda: next(tokens))
    (tmp_path / ".e.takentak.tmp.txt").write_text("someone else's")
    with atomic_path(tmp_path / "e.txt") as tmp:
        assert tmp.name == ".e.freefree.tmp.txt" and tmp.read_bytes() == b""
        tmp.write_text("mine")
    assert (tmp_path / "e.txt").read_text() == "mine"
    assert (tmp_path / ".e.takentak.tmp.txt").read_text() == "someone else's"


def test_path_inside(tmp_path):
    root = tmp_path / "root"
    (root / "turn_000").mkdir(parents=True)
    (root / "escape").symlink_to(tmp_path)
    assert path_inside(root, "turn_000") == (root / "turn_000").resolve()
    assert path_inside(root, root / "turn_000" / "x.mp4") == (root / "turn_000" / "x.mp4").resolve()
    for bad in ("..", "../root2", "/etc/passwd", "escape", "escape/x", "turn_000/../../x"):
        with pytest.raises(ValueError, match="outside"):
            path_inside(root, bad)


# ---------------------------------------------------------------- bounded reads and directory locks

def test_check_regular_file_refuses_pipes_devices_dirs_loops_and_big_files(tmp_path):
    fifo = tmp_path / "turns.jsonl"
    os.mkfifo(fifo)
    loop = tmp_path / "weights.safetensors"
    loop.symlink_to(loop)
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 101)
    cases = {fifo: "named pipe", Path("/dev/zero"): "character device", tmp_path: "a directory",
             loop: "cannot be read", big: "more than the 100"}
    for path, words in cases.items():
        with pytest.raises(ValueError, match=words) as info:
            agio.check_regular_file(path, max_bytes=100)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(FileNotFoundError):
        agio.check_regular_file(tmp_path / "missing")
    ok = tmp_path / "ok.json"
    ok.write_text("{}")
    assert agio.check_regular_file(ok, max_bytes=100).st_size == 2


def test_bounded_reads_return_the_content_or_refuse(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("héllo")
    assert agio.read_text_bounded(path, 100) == "héllo"
    with pytest.raises(ValueError, match="more than the 3 allowed"):
        agio.read_bytes_bounded(path, 3)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8"):
        agio.read_text_bounded(path, 100)
    with pytest.raises(ValueError, match="character device"):
        agio.read_bytes_bounded("/dev/zero", 100)


def test_directory_lock_refuses_a_second_holder_and_is_taken_over_after_its_death(tmp_path):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom animegamer.io import directory_lock\n"
         "with directory_lock(sys.argv[1], 'train stage b'):\n    print('held', flush=True)\n    time.sleep(600)\n",
         str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(agio.DirectoryLocked, match=rf"PID {holder.pid} \('train stage b'"):
            with agio.directory_lock(tmp_path, "second"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with agio.directory_lock(tmp_path, "third") as lock:  # the dead holder's lock is taken over
        assert '"command": "third"' in lock.read_text()
    with agio.directory_lock(tmp_path, "fourth"):  # released on leaving the block
        pass


def test_update_json_keeps_every_writers_key_when_processes_write_side_by_side(tmp_path):
    import json
    import subprocess
    import sys

    path = tmp_path / "run" / "summary.json"
    assert agio.update_json(path, "data", {"seconds": 1.5}) == {"data": {"seconds": 1.5}}  # created with its folder
    # four processes, each setting 25 keys of its own: a read-modify-write without the lock loses some of them
    code = ("import sys\nfrom animegamer.io import update_json\n"
            "for i in range(25):\n    update_json(sys.argv[1], f'{sys.argv[2]}_{i}', i)\n")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(path), name]) for name in "abcd"]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    data = json.loads(path.read_text())
    assert data == {"data": {"seconds": 1.5}, **{f"{n}_{i}": i for n in "abcd" for i in range(25)}}
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json", "summary.json.lock"]  # no temp left
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds list, not a JSON object"):
        agio.update_json(path, "x", 1)
    assert path.read_text() == "[1, 2]"  # a file that is not ours to merge into is left as it was


def test_stale_temps_of_a_killed_writer_are_removed_and_nothing_else(tmp_path):
    from animegamer.io import remove_stale_temps

    run = tmp_path / "run"
    killed = []  # what atomic_path leaves when its process is killed before the rename (mkstemp makes the same names)
    for folder in (run, run / "clips", run / "clips" / "film", run / "clips" / "film" / "deeper"):
        folder.mkdir(parents=True)
        for name, suffix in (("clip", ".mp4"), ("film", ".json"), ("turns", "")):
            fd, stale = tempfile.mkstemp(prefix=f".{name}.", suffix=f".tmp{suffix}", dir=folder)
            os.close(fd)
            killed.append(Path(stale))
    keep = [run / "notes.tmp.txt", run / ".hidden", run / "clip.mp4", run / ".a.b.tmp", run / ".x.abc.tmp.mp4"]
    for path in keep:
        path.write_text("mine")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / ".x.abcdefgh.tmp.json").write_text("{}")
    (run / "clips" / "link").symlink_to(tmp_path / "elsewhere")  # a link is never followed
    removed = remove_stale_temps(run, depth=2)
    assert sorted(removed) == sorted(p for p in killed if "deeper" not in p.parts)  # two folders down, no more
    assert all(not p.exists() for p in removed) and all(p.read_text() == "mine" for p in keep)
    assert (tmp_path / "elsewhere" / ".x.abcdefgh.tmp.json").exists()
    assert all(p.exists() for p in killed if "deeper" in p.parts)
    assert remove_stale_temps(tmp_path / "missing") == []
