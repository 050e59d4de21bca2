import json
import os
import shutil
import signal
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import imageio.v2 as imageio
import imageio_ffmpeg
import numpy as np
import pytest

from animegamer.data.manifest import read_manifest
from animegamer.data.video import probe_video, read_video, write_mp4
from animegamer.states import parse_tags
from tests.helpers.limits import directory_held, python_env, run_python
from tests.helpers.llm_server import FakeChatServer
from tests.helpers.synthetic_films import make_film, moving_patch_frames

pytestmark = pytest.mark.slow  # an end-to-end run: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "prepare_data.py"
SPEEDS = [0.33, 0.67, 1.33, 2.0, 2.67]  # px per source frame; x2 (16 -> 8 fps) x0.75 (resize) per clip frame
GOOD = "<S>Girl</S><MD>walk</MD><EV>street</EV><MA>slowly</MA><SC>0</SC><ET>0</ET><ST>0</ST>"


@pytest.fixture(scope="module")
def films_dir(tmp_path_factory):
    """Five one-clip films of known speeds (one with a letterbox and a cut: two clips), plus two broken films."""
    root = tmp_path_factory.mktemp("films")
    for i, speed in enumerate(SPEEDS):
        extra = {"seconds": 4.75, "cuts": (2.25,), "bars": (8, 8, 0, 0)} if i == 2 else {"seconds": 2.5}
        make_film(root / f"speed{i}.mp4", speed=speed, seed=i, **extra)
    (root / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + os.urandom(3000))
    # A truncated download: the index is up front (faststart), the frame data stops half way.
    writer = imageio.get_writer(
        str(root / "full.mp4"), format="FFMPEG", fps=16, codec="libx264", pixelformat="yuv420p",
        macro_block_size=1, ffmpeg_params=["-movflags", "+faststart"],
    )
    for frame in moving_patch_frames(48, 64, 96, 1.0):
        writer.append_data(frame)
    writer.close()
    data = (root / "full.mp4").read_bytes()
    (root / "full.mp4").unlink()
    (root / "truncated.mkv").write_bytes(data[: len(data) // 2])
    return root


def args(films, out, *extra):
    return ["--config", str(ROOT / "configs/prepare_data.yaml"), f"films=[{films}]", f"output_dir={out}",
            "height=48", "width=64", "flow_preset=fast", *extra]


def test_help_documents_the_whole_flow():
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True,
                            env=python_env())  # this checkout's package, wherever the venv points
    for text in ("1. cut", "2. motion", "3. levels", "4. caption", "Resumable", "corrupt", "clips.jsonl",
                 "films=[]", "flow_threshold=0.2", "captioner.max_attempts=3", "refit_motion_bins=False"):
        assert text in result.stdout, text


def test_cut_motion_levels_skip_bad_films_and_resume(films_dir, tmp_path, capsys):
    script = import_module("scripts.prepare_data")
    out = tmp_path / "out"
    films_dir = Path(shutil.copytree(films_dir, tmp_path / "films"))  # this test edits a film
    summary = script.main(args(films_dir, out, "workers=2"))
    bad = {str(films_dir / "corrupt.mp4"), str(films_dir / "truncated.mkv")}
    assert set(summary["skipped"]) == bad
    assert all(path in summary["skipped"][path] for path in bad)
    assert (summary["films"], summary["films_cut"], summary["films_skipped"]) == (7, 5, 2)
    assert (summary["scenes"], summary["clips"]) == (6, 6)
    printed = capsys.readouterr().out
    assert all(f"skipped {path}" in printed for path in bad)
    assert json.loads((out / "prepare_report.json").read_text())["clips"] == 6

    manifest = read_manifest(out / "clips.jsonl")
    films = manifest.films()
    assert list(films) == [f"speed{i}" for i in range(5)]
    assert [(r.start, r.end) for r in films["speed2"]] == [(0.0, 2.0), (2.25, 4.25)]
    for record in manifest.records:
        assert record.video == f"clips/{record.film_id}/{record.clip_index:05d}.mp4"
        info = probe_video(manifest.video_path(record))
        assert (info.num_frames, info.height, info.width) == (17, 48, 64)
    # Motion levels follow the true speeds; edges and flow settings are in the meta sidecar.
    by_speed = [(SPEEDS[int(r.film_id[-1])], r.motion_level) for r in manifest.records]
    for speed_a, level_a in by_speed:
        for speed_b, level_b in by_speed:
            if speed_a < speed_b:
                assert level_a <= level_b, by_speed
    assert min(by_speed)[1] == 1 and max(by_speed)[1] == 5
    motion = manifest.meta["motion"]
    assert len(motion["edges"]) == 4 and motion["fitted_on"] == 6
    assert (motion["method"], motion["threshold"], motion["height"], motion["width"]) == ("dis", 0.2, 48, 64)

    # Rerun: finished films are not touched, broken ones are tried (and reported) again.
    files = sorted(out.glob("clips/*/*"))
    stamps = [f.stat().st_mtime_ns for f in files]
    again = script.main(args(films_dir, out, "workers=2"))
    assert (again["films_cut"], again["films_already_done"], again["films_skipped"]) == (0, 5, 2)
    assert "5 film(s) already done" in capsys.readouterr().out
    assert [f.stat().st_mtime_ns for f in sorted(out.glob("clips/*/*"))] == stamps
    assert read_manifest(out / "clips.jsonl").records == manifest.records

    # A changed film is cut again, alone; its clips are scored with the stored bin edges.
    make_film(films_dir / "speed0.mp4", speed=SPEEDS[0], seconds=4.5, seed=9)
    third = script.main(args(films_dir, out, "workers=1"))
    assert (third["films_cut"], third["films_already_done"], third["clips"]) == (1, 4, 7)
    assert "reusing the stored bin edges" in capsys.readouterr().out
    assert read_manifest(out / "clips.jsonl").meta["motion"]["edges"] == motion["edges"]
    assert [f.stat().st_mtime_ns for f in sorted(out.glob("clips/speed4/*"))] == [
        s for f, s in zip(files, stamps, strict=True) if f.parent.name == "speed4"
    ]


def test_captions_retried_marked_and_kept_on_rerun(films_dir, tmp_path):
    script = import_module("scripts.prepare_data")
    out = tmp_path / "out"
    films = f"{films_dir / 'speed3.mp4'},{films_dir / 'speed2.mp4'}"  # three clips: speed2 x2, speed3
    answers = ["no tags, sorry", GOOD, GOOD.replace("slowly", "quickly"), "<S>Girl</S>", "<S>Girl</S><MD>x</MD>"]
    with FakeChatServer(answers) as server:
        caption = ["caption=true", "workers=1", "captioner.backend.type=openai", "captioner.backend.retries=0",
                   f"captioner.backend.base_url={server.base_url}", "captioner.workers=1", "captioner.max_attempts=2"]
        summary = script.main(args(films, out, *caption))
    assert answers == []  # exactly the calls expected: 2 + 1 + 2
    assert (summary["captions_ok"], summary["captions_invalid"], summary["uncaptioned"]) == (2, 1, 0)
    manifest = read_manifest(out / "clips.jsonl")
    statuses = {r.clip_id: r.caption_status for r in manifest.records}
    assert statuses == {"speed2_00000": "ok", "speed2_00001": "ok", "speed3_00000": "invalid"}
    for record in manifest.records:
        if record.caption_status == "ok":
            assert parse_tags(record.tags).values.motion_level == record.motion_level
        else:
            assert record.tags is None and record.extra["caption_error"]
    assert manifest.meta["caption"]["backend"]["type"] == "openai"

    with FakeChatServer([]) as server:  # nothing left to ask
        caption[5] = f"captioner.backend.base_url={server.base_url}"
        again = script.main(args(films, out, *caption))
        assert server.requests == []
    assert (again["films_cut"], again["captions_ok"], again["captions_invalid"]) == (0, 2, 1)
    assert read_manifest(out / "clips.jsonl").records == manifest.records


def test_bad_config_fails_before_any_work(tmp_path, capsys):
    script = import_module("scripts.prepare_data")
    with pytest.raises(SystemExit) as exc:
        script.main(args(tmp_path / "none", tmp_path / "out"))
    assert exc.value.code == 2 and "none" in capsys.readouterr().err
    make_film(tmp_path / "a.mp4")
    with pytest.raises(SystemExit):
        script.main(args(tmp_path / "a.mp4", tmp_path / "out", "flow=raft", "raft_weights=missing.pt"))
    assert "missing.pt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(args(tmp_path / "a.mp4", tmp_path / "out", "caption=true", "characters=nobody.json"))
    assert "character registry not found: nobody.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a clip of one frame (was: every film skipped with a ZeroDivisionError)
        script.main(args(tmp_path / "a.mp4", tmp_path / "out", "clip_seconds=0.05"))
    assert "a clip needs at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # 16.8 frame steps (was: clips drifting from the plan, across cuts)
        script.main(args(tmp_path / "a.mp4", tmp_path / "out", "clip_seconds=2.1"))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: clip_seconds=2.1 at fps=8 is 16.8 frame steps" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_touched_or_moved_films_keep_their_clips_and_captions(films_dir, tmp_path):
    script = import_module("scripts.prepare_data")
    films = Path(shutil.copytree(films_dir, tmp_path / "films", ignore=shutil.ignore_patterns("corrupt*", "trunc*")))
    out = tmp_path / "out"
    with FakeChatServer([GOOD] * 6) as server:
        caption = ["caption=true", "workers=1", "captioner.backend.type=openai", "captioner.backend.retries=0",
                   f"captioner.backend.base_url={server.base_url}", "captioner.workers=1"]
        first = script.main(args(films, out, *caption))
    assert (first["clips"], first["captions_ok"]) == (6, 6)
    records = read_manifest(out / "clips.jsonl").records
    assert all(len(r.extra["frames_hash"]) == 32 for r in records)

    # Touch every film and move the folder: nothing is cut again and no caption is asked for again.
    for film in films.iterdir():
        os.utime(film, ns=(film.stat().st_atime_ns, film.stat().st_mtime_ns + 10**10))
    moved = Path(shutil.move(films, tmp_path / "moved"))
    with FakeChatServer([]) as server:
        caption[4] = f"captioner.backend.base_url={server.base_url}"
        again = script.main(args(moved, out, *caption))
        assert server.requests == []
    assert (again["films_cut"], again["films_already_done"], again["captions_ok"]) == (0, 5, 6)
    manifest = read_manifest(out / "clips.jsonl")
    assert manifest.records == records
    assert all(source.startswith(str(moved)) for source in manifest.meta["films"].values())

    # Settings that re-cut every film but give the same frames: the clips keep their captions.
    with FakeChatServer([]) as server:
        caption[4] = f"captioner.backend.base_url={server.base_url}"
        recut = script.main(args(moved, out, *caption, "scene_threshold=26"))
        assert server.requests == []
    assert (recut["films_cut"], recut["captions_ok"], recut["uncaptioned"]) == (5, 6, 0)
    assert [r.tags for r in read_manifest(out / "clips.jsonl").records] == [r.tags for r in records]


def corrupt_middle(path: Path, fraction: float = 0.05) -> None:
    """Flip the bits of ``fraction`` of the file's bytes from its middle (the frame data of an mp4)."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2
    for i in range(start, start + int(len(data) * fraction)):
        data[i] ^= 0x55
    path.write_bytes(bytes(data))


def test_corrupt_data_in_the_middle_is_counted_and_smeared_clips_dropped(tmp_path):
    script = import_module("scripts.prepare_data")
    films = tmp_path / "films"
    make_film(films / "clean.mp4", seconds=8.25, cuts=(4.125,), speed=2.0, seed=3)
    make_film(films / "broken.mp4", seconds=8.25, cuts=(4.125,), speed=2.0, seed=3)
    corrupt_middle(films / "broken.mp4")
    summary = script.main(args(films, tmp_path / "out", "workers=1", "max_decode_errors=1000"))
    clean, broken = summary["per_film"]["clean"], summary["per_film"]["broken"]
    assert clean["decode_errors"] == 0 and clean["written"] == 4
    assert broken["decode_errors"] > 0 and broken["dropped_for_decode_errors"] > 0
    assert broken["written"] < clean["written"]
    assert summary["decode_errors"] == broken["decode_errors"]
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    assert report["per_film"]["broken"]["decode_errors"] == broken["decode_errors"]

    # Past the threshold the film is skipped and reported (and tried again on the next run).
    strict = script.main(args(films, tmp_path / "strict", "workers=1", "max_decode_errors=0"))
    assert list(strict["skipped"]) == [str(films / "broken.mp4")]
    assert "decoder errors" in strict["skipped"][str(films / "broken.mp4")]
    assert not (tmp_path / "strict" / "clips" / "broken").exists()


def test_ctrl_c_stops_at_once_and_keeps_finished_films(tmp_path):
    import time

    films = tmp_path / "films"
    # The two films the workers take first are short, the other four twelve times longer: when the first film.json
    # appears, most of the work is still ahead, however slowly a loaded machine runs all of it (at four times, a
    # test process starved by parallel tests sometimes woke after the whole run had finished).
    for i in range(6):
        seconds, cuts = (6.25, (2.25, 4.25)) if i < 2 else (72.25, tuple(4.25 + 4.0 * k for k in range(17)))
        make_film(films / f"film{i}.mp4", seconds=seconds, cuts=cuts, speed=1.0 + i, seed=i)
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), *args(films, out, "workers=2")]
    # SIGINT at its default in the child: an earlier test in this worker may leave it ignored, which a child inherits
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env=python_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not list(out.glob("clips/*/film.json")) and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    # (the killed workers' ffmpeg writers may print after it)
    assert "Traceback" not in stderr and any(line.startswith("interrupted:") for line in stderr.splitlines())
    finished = {p.parent.name for p in out.glob("clips/*/film.json")}
    assert finished and not (out / "clips.jsonl").exists()
    for i in range(6):  # the rerun cuts the unfinished films again from the start: short ones do (a minute less)
        if f"film{i}" not in finished:
            make_film(films / f"film{i}.mp4", seconds=6.25, cuts=(2.25, 4.25), speed=1.0 + i, seed=i)
    summary = import_module("scripts.prepare_data").main(args(films, out, "workers=1"))
    assert summary["films_already_done"] == len(finished) and summary["films_cut"] == 6 - len(finished)


def test_a_killed_worker_skips_its_films_instead_of_hanging(tmp_path):
    import multiprocessing
    import signal

    script = import_module("scripts.prepare_data")
    films = tmp_path / "films"
    for i in range(4):
        make_film(films / f"film{i}.mp4", seconds=12.25, cuts=(4.25, 8.25), speed=1.0 + i, seed=i)
    cut = script.CutSettings(height=48, width=64)
    jobs = [script.FilmJob(str(path), path.stem, str(tmp_path / "out"), cut) for path in sorted(films.iterdir())]
    results = []

    def on_result(result):  # the first film back: every worker is killed, as the OOM killer would
        if not results:
            for process in multiprocessing.active_children():
                os.kill(process.pid, signal.SIGKILL)
        results.append(result)

    script.pooled_films(jobs, 2, on_result)  # returns (it hung forever with multiprocessing.Pool)
    assert sorted(r.film_id for r in results) == [job.film_id for job in jobs]
    died = [r for r in results if r.error]
    assert died and all("worker process died" in r.error for r in died)


@pytest.mark.parametrize("where", ["inside", "same", "symlink"])
def test_output_inside_the_films_folder_is_refused_before_any_work(tmp_path, capsys, where):
    """A rerun would cut the previous run's clips as new films (duplicates under new ids: train/test leakage)."""
    films = tmp_path / "films"
    films.mkdir()
    make_film(films / "a.mp4")
    out = {"inside": films / "prepared", "same": films, "symlink": tmp_path / "link" / "prepared"}[where]
    (tmp_path / "link").symlink_to(films)
    with pytest.raises(SystemExit) as exc:
        import_module("scripts.prepare_data").main(args(films, out))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and "output_dir" in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in films.iterdir()) == ["a.mp4"]  # nothing written


def test_pipes_and_symlink_loops_are_reported_and_counted(tmp_path, capsys):
    films = tmp_path / "films"
    films.mkdir()
    make_film(films / "a.mp4")
    os.mkfifo(films / "pipe.mp4")
    (films / "loop.mkv").symlink_to("loop.mkv")
    summary = import_module("scripts.prepare_data").main(args(films, tmp_path / "out"))
    assert (summary["films"], summary["films_cut"], summary["films_skipped"]) == (3, 1, 2)
    assert "named pipe" in summary["skipped"][str(films / "pipe.mp4")]
    assert "symlink loop" in summary["skipped"][str(films / "loop.mkv")]
    printed = capsys.readouterr().out
    for name in ("pipe.mp4", "loop.mkv"):
        assert sum(f"skipped {films / name}: " in line for line in printed.splitlines()) == 1
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text())
    assert report["films_skipped"] == 2


# ---------------------------------------------------------------------- an unlucky machine: full disk, kills, locks


def noisy_film(path: Path) -> None:
    """A film whose clip is ~3x the size of a smooth film's (fresh noise every frame, too faint to read as cuts)."""
    base = moving_patch_frames(40, 64, 96, 1.0).astype(int)
    noise = np.random.default_rng(0).integers(-25, 26, base.shape)
    write_mp4(path, np.clip(base + noise, 0, 255).astype(np.uint8), fps=16)


@pytest.mark.parametrize("limit", [2_000, 6_000])
def test_a_full_disk_fails_the_films_it_hits_and_publishes_no_undecodable_clip(tmp_path, limit):
    """Under a real write limit (smooth clips ~3 kB, the noisy film's ~9.5 kB, records under 2 kB) a clip that
    cannot be written whole is never published: its film is reported as failed, the others go on."""
    films = tmp_path / "films"
    make_film(films / "smooth.mp4", seconds=2.5)
    make_film(films / "other.mp4", seconds=2.5, seed=4)
    noisy_film(films / "noisy.mp4")
    out = tmp_path / "out"
    result = run_python([str(SCRIPT), *args(films, out)], file_limit=limit)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    report = json.loads((out / "prepare_report.json").read_text())
    failed = {Path(source).stem for source in report["skipped"]}
    assert "noisy" in failed and (failed == {"noisy"}) == (limit == 6_000), report["skipped"]
    assert all("VideoWriteError" in error for error in report["skipped"].values())
    for clip in out.rglob("*.mp4"):  # every clip published decodes whole
        assert probe_video(clip).num_frames == 17 and len(read_video(clip)[0]) == 17
    assert {p.parent.name for p in out.rglob("*.mp4")} == {"smooth", "other"} - failed
    assert not [p for p in out.rglob(".*") if p.name != ".animegamer.lock"]  # no temp file anywhere


def test_audio_only_films_and_names_that_are_not_utf8_are_handled_and_rerun(tmp_path):
    films = tmp_path / "films"
    make_film(films / "good.mp4")
    names = [b"caf\xe9.mp4", b"\xff\xfe.mkv", b"half\xe2\x82.mp4"]  # Latin-1, junk, a cut-off UTF-8 sequence
    for i, name in enumerate(names):
        make_film(os.fsdecode(os.path.join(os.fsencode(films), name)), seed=i + 1)
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "sine=duration=3",
                    "-c:a", "aac", str(films / "song.mp4")], check=True)
    out = tmp_path / "out"
    for run in range(2):  # a rerun works and cuts nothing again
        result = run_python([str(SCRIPT), *args(films, out)])
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        report = json.loads((out / "prepare_report.json").read_text(encoding="utf-8"))
        assert (report["films_cut"], report["films_already_done"]) == ((4, 0) if run == 0 else (0, 4))
    assert report["clips"] == 4 and report["films_skipped"] == 1
    (song, error), = report["skipped"].items()
    assert song == str(films / "song.mp4") and "no video stream" in error
    sources = json.loads((out / "clips.meta.json").read_text(encoding="utf-8"))["films"].values()
    assert sorted(sources) == sorted([str(films / "good.mp4"), str(films) + "/caf\\xe9.mp4",
                                      str(films) + "/\\xff\\xfe.mkv", str(films) + "/half\\xe2\\x82.mp4"])


def worker_pids(pid: int) -> list[int]:
    """The film workers (multiprocessing spawn children) among the children of ``pid``."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for its reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from Linux's /proc")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_film_workers_do_not_outlive_the_main_process(tmp_path, how):
    import time

    films = tmp_path / "films"
    for i in range(4):  # long enough that the workers are busy when the main process goes
        make_film(films / f"film{i}.mp4", seconds=40.25, cuts=tuple(4.25 + 4.0 * k for k in range(9)), seed=i)
    process = subprocess.Popen([sys.executable, str(SCRIPT), *args(films, tmp_path / "out", "workers=2")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env=python_env())
    deadline = time.monotonic() + 300
    while len(workers := worker_pids(process.pid)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the process tree: there is no event to wait for
    assert len(workers) == 2 and process.poll() is None, process.communicate()
    process.send_signal(how)
    _, stderr = process.communicate(timeout=120)
    deadline = time.monotonic() + 120
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers), f"a film worker outlived the main process: {stderr}"
    if how == signal.SIGTERM:  # stopped like Ctrl-C: one line, finished films kept
        assert process.returncode == 143 and "Traceback" not in stderr, (process.returncode, stderr)
        assert any(line.startswith("terminated:") for line in stderr.splitlines()), stderr


def test_a_second_run_into_the_same_output_dir_is_refused_and_stale_temps_are_cleaned(tmp_path):
    films = tmp_path / "films"
    make_film(films / "a.mp4")
    out = tmp_path / "out"
    (out / "clips" / "a").mkdir(parents=True)
    stale = [out / ".clips.k3j_x9a2.tmp.jsonl", out / "clips" / "a" / ".00000.abcdefgh.tmp.mp4"]
    for path in stale:  # what a killed run leaves
        path.write_bytes(b"half")
    keep = out / "clips" / "notes.tmp.txt"
    keep.write_text("mine")
    with directory_held(out) as holder:
        result = run_python([str(SCRIPT), *args(films, out)])
        assert result.returncode == 2 and result.stderr.startswith("error: "), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and f"PID {holder}" in result.stderr
        assert all(path.exists() for path in stale)  # the holder's files are not touched
    result = run_python([str(SCRIPT), *args(films, out)])  # the holder gone: its lock is taken over
    assert result.returncode == 0, result.stderr
    assert not any(path.exists() for path in stale) and keep.read_text() == "mine"
    assert read_manifest(out / "clips.jsonl").records[0].film_id == "a"
