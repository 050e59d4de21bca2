"""The benchmark's real-time options part on the tiny decoder: every row, its call counts, its first frames."""

import math

import pytest
import torch

from animegamer.bench.options import bench_options, decode_and_write, distilled_timesteps
from animegamer.bench.report import options_table, turn_profile_table
from animegamer.config import DecoderConfig, SamplingConfig
from animegamer.models.decoder import AnimationShotDecoder

pytestmark = pytest.mark.usefixtures("one_thread")


def _decoder(tiny_cogvideox_dir) -> AnimationShotDecoder:
    torch.manual_seed(0)
    cfg = DecoderConfig(pretrained=str(tiny_cogvideox_dir), lora_rank=4, lora_alpha=4, motion_embed_dim=16,
                        gradient_checkpointing=False, dtype="fp32")
    return AnimationShotDecoder.from_config(cfg).eval()


@pytest.mark.slow
def test_every_option_is_timed_and_counted(tiny_cogvideox_dir):
    decoder = _decoder(tiny_cogvideox_dir)
    assert distilled_timesteps(decoder) == (999, 759, 499, 239)  # configs/stage_d.yaml's student
    sampling = SamplingConfig(height=48, width=64, num_frames=17)  # 5 latent frames: the first chunk is 3
    shot = torch.randn(1, 226, 32, generator=torch.Generator().manual_seed(0))
    result = bench_options(decoder, shot, torch.tensor([3]), sampling, "cpu", warmup=0, repeats=1, steps=10)
    rows = result["rows"]
    assert list(rows) == ["standard", "fast", "distilled", "cache first_block", "cache taylorseer", "cache pab",
                          "cache faster", "cache magcache"]
    assert result["skipped"] and "CUDA" in result["skipped"][0]  # no FP8 rows on a CPU
    # 10 steps, all guided (at 50 the ramp reaches 1.0 at the last); fast: 10 steps, 4 guided; distilled: 4 calls
    assert [rows[k]["transformer_calls"] for k in ("standard", "fast", "distilled")] == [20, 14, 4]
    assert rows["distilled"]["attention_work"] == pytest.approx(4 / 20)
    for name in ("cache taylorseer", "cache pab", "cache faster", "cache magcache"):
        assert rows[name]["transformer_calls"] == 20 and rows[name]["attention_work"] < 1, name
    for row in rows.values():
        assert row["first_frames"] == 9
        for key in ("denoise_s", "first_chunk_decode_s", "time_to_first_frame_s", "speedup_vs_standard"):
            assert math.isfinite(row[key]) and row[key] > 0
        assert row["time_to_first_frame_s"] == pytest.approx(row["denoise_s"] + row["first_chunk_decode_s"])
    profile = result["profile"]  # the rest of a turn: the whole decode and writing mp4 + gif, once
    assert profile["frames"] == 17 and profile["vae_decode_s"] > 0 and profile["write_s"] > 0
    assert rows["fast"]["render_s"] == pytest.approx(rows["fast"]["denoise_s"] + profile["vae_decode_s"]
                                                     + profile["write_s"])
    table = "\n".join(options_table({"options": result}))
    assert "| distilled | 4 |" in table and "first 9 frames" in table and "Not measured: fp8" in table
    assert "Where a turn's time goes** (17 frames; MLLM from the turn part: not run" in table
    with_mllm = "\n".join(options_table({"options": result, "turn": {"ours": {"mllm_s": 1.5}}}))
    line = next(x for x in with_mllm.splitlines() if x.startswith("| distilled | 1.500 | 4 |"))
    assert line.endswith(f"| {1.5 + rows['distilled']['time_to_first_frame_s']:.3f} |")


def test_writing_that_fails_is_reported_not_fatal(tiny_cogvideox_dir, tmp_path, monkeypatch):
    # imageio-ffmpeg runs the binary IMAGEIO_FFMPEG_EXE names: one that does not exist is a machine without ffmpeg
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "no-ffmpeg"))
    decoder = _decoder(tiny_cogvideox_dir)
    latents = torch.randn(1, 2, 4, 6, 8, generator=torch.Generator().manual_seed(0))
    profile = decode_and_write(decoder, latents, fps=8, device="cpu", warmup=0, repeats=1)
    assert profile["vae_decode_s"] > 0 and profile["write_s"] is None and profile["raw_write_s"] == []
    assert "no-ffmpeg" in profile["write_error"] and "\n" not in profile["write_error"]  # names the missing binary
    options = {"rows": {"standard": {"transformer_calls": 2, "denoise_s": 0.5, "time_to_first_frame_s": 0.6,
                                     "render_s": 0.7}}, "profile": profile}
    table = "\n".join(turn_profile_table(options, None))
    assert "| standard | — | 2 | 0.500 |" in table and "Writing not measured (" in table
