"""The benchmark's ``decode`` part: full VAE against the small causal decoder on the same 4-step latents."""

import json
from importlib import import_module

import pytest

from animegamer.bench.report import markdown

pytestmark = pytest.mark.usefixtures("one_thread")


def test_decode_part_times_both_decoders_and_the_first_frames(tmp_path):
    result = import_module("scripts.benchmark").main(["--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path}",
                                            "parts=[decode]", "repeats=1", "warmup=0"])
    assert not result["errors"]
    decode = json.loads((tmp_path / "benchmark.json").read_text())["decode"]
    rows = decode["rows"]
    assert list(rows) == ["full VAE", "small"]  # compile=false in the tiny config
    # the tiny VAE decodes its 3 latent frames in one batch; the small decoder hands out the first frame alone
    assert (rows["full VAE"]["first_frames"], rows["full VAE"]["frames"]) == (9, 9)
    assert (rows["small"]["first_frames"], rows["small"]["frames"]) == (1, 9)
    for row in rows.values():
        assert 0 < row["first_chunk_s"] and row["time_to_first_frames_s"] == pytest.approx(
            decode["denoise_s"] + row["first_chunk_s"])
    assert decode["parameters"]["small_decoder"] < decode["parameters"]["vae_decoder"]
    assert len(decode["settings"]["student_timesteps"]) == 4
    assert "Decode: full VAE vs the small causal decoder" in markdown(result)
