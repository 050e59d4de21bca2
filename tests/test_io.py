"""animegamer.io: atomic writes keep the umask's mode, are fsynced before the rename, and paths stay inside."""

import os

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


def test_path_inside(tmp_path):
    root = tmp_path / "root"
    (root / "turn_000").mkdir(parents=True)
    (root / "escape").symlink_to(tmp_path)
    assert path_inside(root, "turn_000") == (root / "turn_000").resolve()
    assert path_inside(root, root / "turn_000" / "x.mp4") == (root / "turn_000" / "x.mp4").resolve()
    for bad in ("..", "../root2", "/etc/passwd", "escape", "escape/x", "turn_000/../../x"):
        with pytest.raises(ValueError, match="outside"):
            path_inside(root, bad)
