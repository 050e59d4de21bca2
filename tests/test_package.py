import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from animegamer.data.video import VideoReadError, probe_video, read_video, write_gif, write_mp4
from animegamer.io import atomic_write_json
from tests.helpers.clips import make_clip_frames

ROOT = Path(__file__).resolve().parents[1]


def test_import_is_light():
    heavy = ("torch", "diffusers", "transformers", "open_clip")
    code = "import sys, animegamer, animegamer.states, animegamer.config\n"
    code += f"print([m for m in {heavy} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_real_data_path_never_imports_spriteworld():
    """Every module of the core (data, game, models, recipes, sampling, training) imports without SpriteWorld:
    the real-data path stands on its own (SpriteWorld lives in animegamer.spriteworld, beside it)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "names = []\n"
        "for part in ('data', 'game', 'models', 'recipes', 'sampling', 'training'):\n"
        "    package = importlib.import_module(f'animegamer.{part}')\n"
        "    names += [m.name for m in pkgutil.walk_packages(package.__path__, f'animegamer.{part}.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names), sorted(m for m in sys.modules if m.startswith('animegamer.spriteworld')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    count, loaded = out.stdout.strip().split(" ", 1)
    assert int(count) >= 30  # 40 modules today: the walk found the packages' modules, not nothing
    assert loaded == "[]"


def test_video_round_trip(tmp_path):
    frames = make_clip_frames(16, 48, 64, speed=2.0)
    path = write_mp4(tmp_path / "a.mp4", frames, fps=8)
    info = probe_video(path)
    assert (info.num_frames, info.height, info.width) == (16, 48, 64) and info.fps == pytest.approx(8)
    decoded, fps = read_video(path)
    assert decoded.shape == frames.shape and fps == pytest.approx(8)
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 12  # lossy codec, same picture
    part, _ = read_video(path, start=1.0, end=1.5)
    assert len(part) == 4
    resampled, new_fps = read_video(path, fps=4)
    assert new_fps == 4 and len(resampled) == 8
    gif = write_gif(tmp_path / "a.gif", frames, fps=8)
    assert gif.stat().st_size > 0 and gif.read_bytes()[:3] == b"GIF"


def test_gif_holds_every_frame_close_to_the_source(tmp_path):
    from PIL import Image

    frames = make_clip_frames(9, 48, 64, speed=2.0)
    gif = write_gif(tmp_path / "a.gif", frames, fps=8)
    with Image.open(gif) as image:
        assert image.n_frames == 9 and image.size == (64, 48) and image.info["loop"] == 0
        assert image.info["duration"] == 120  # 8 fps: 125 ms, stored in hundredths of a second
        for i, frame in enumerate(frames):
            image.seek(i)
            # a 256-colour palette per frame: close to the frame, not equal to it
            assert np.abs(np.asarray(image.convert("RGB"), dtype=int) - frame).mean() < 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gif"]  # written through a temp file, renamed


def test_decord_backend_matches_pyav(synthetic_clip):
    pytest.importorskip("decord")
    path, frames = synthetic_clip
    a, _ = read_video(path, backend="pyav")
    b, _ = read_video(path, backend="decord")
    assert a.shape == b.shape and np.abs(a.astype(int) - b.astype(int)).mean() < 3


def test_corrupt_and_missing_videos(tmp_path, synthetic_clip):
    path, _ = synthetic_clip
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 10)
    for bad in (junk, tmp_path / "missing.mp4"):
        with pytest.raises(VideoReadError, match=bad.name):
            read_video(bad)
    try:  # a truncated file may still yield its first frames; it must never crash with a foreign error
        frames, _ = read_video(broken)
        assert frames.ndim == 4
    except VideoReadError as exc:
        assert "broken.mp4" in str(exc)


def test_atomic_json_leaves_no_temp(tmp_path):
    atomic_write_json(tmp_path / "x.json", {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


@pytest.mark.slow
def test_encode_clip_demo_runs(tmp_path, tiny_clip_config, tiny_t5_config):
    args = [
        sys.executable, str(ROOT / "scripts/encode_clip.py"), "--config", str(ROOT / "configs/tiny/stage_a.yaml"),
        f"output_dir={tmp_path}", f"clip.checkpoint={tiny_clip_config.checkpoint}",
        f"clip.model_config={tiny_clip_config.model_config}", f"t5.path={tiny_t5_config.path}",
    ]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "s_a           (1, 226, 32)" in out.stdout
    assert (tmp_path / "shot_embeds.safetensors").is_file()


@pytest.mark.slow
def test_entry_point_rejects_bad_override(tmp_path):
    args = [sys.executable, str(ROOT / "scripts/encode_clip.py"), "--config",
            str(ROOT / "configs/tiny/stage_a.yaml"), "encoder.fusion=blend"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "encoder.fusion='blend' is not one of" in out.stderr
