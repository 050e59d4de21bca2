"""The benchmark's ``fast_path`` part: the game's whole turn (MLLM, 4-step student, small decoder) eager and compiled,
part by part and end to end, rows saved as they end."""

import json
from importlib import import_module

import pytest
import torch

from animegamer.bench.fastpath import ROWS, rows_to_run
from animegamer.bench.report import markdown

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rows_this_machine_runs():
    names = [row.name for row in ROWS]
    run, skipped = rows_to_run("cpu", compile=True)
    assert [r.name for r in run] == ["eager", "eager, dynamic MLLM cache", "compiled",
                                     "compiled, MLLM compiled"]  # no FP8 on a CPU
    assert len(skipped) == 3 and all("CUDA GPU" in s for s in skipped)
    run, skipped = rows_to_run("cpu", compile=False)
    assert [r.name for r in run] == ["eager", "eager, dynamic MLLM cache"]
    assert any(s.startswith("compiled: compile=false") for s in skipped)
    assert len(names) == len(set(names)) == 7
    run, skipped = rows_to_run("cpu", compile=True, names=("compiled",))
    assert [r.name for r in run] == ["compiled"] and "eager: not asked for" in skipped
    with pytest.raises(ValueError, match="no fast_path row \\['compield'\\]"):
        rows_to_run("cpu", compile=True, names=("compield",))


def test_a_misspelt_row_is_refused_before_any_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        import_module("scripts.benchmark").main(["--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path}",
                                                  "parts=[fast_path]", "fast_path_rows=[compield]"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: fast_path_rows:") and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing built, nothing written


def test_fast_path_part_times_a_whole_turn_eager_and_compiled(tmp_path):
    out = tmp_path / "bench"
    result = import_module("scripts.benchmark").main([
        "--preset", "tiny", "--device", "cpu", f"output_dir={out}", "parts=[fast_path]", "repeats=1", "warmup=1",
        "compile=true", "compile_backend=aot_eager", "profile=true",
        "fast_path_rows=[eager, 'eager, dynamic MLLM cache', compiled]"])
    assert not result["errors"]
    fast = json.loads((out / "benchmark.json").read_text())["fast_path"]
    rows = fast["rows"]
    assert list(rows) == ["eager", "eager, dynamic MLLM cache", "compiled"]
    # the MLLM's host syncs per turn: the static cache's one transfer against the dynamic cache's 8
    assert rows["eager"]["mllm_host_syncs"] == rows["compiled"]["mllm_host_syncs"] == 1
    assert rows["eager, dynamic MLLM cache"]["mllm_host_syncs"] == 8
    assert rows["eager, dynamic MLLM cache"]["mllm_host_sync_kinds"] == {"from host": 5, "to host": 3}
    assert rows["eager"]["mllm_kv_cache"] == "static" and rows["eager"]["mllm_host_syncs_cuda"] is None
    for row in rows.values():
        # the parts of the game's turn: MLLM + 4-step denoising + the small decoder and its first chunk, each timed
        # on its own (first chunk < whole decode is a speed claim for scripts/benchmark.py: under load the two
        # medians of a tiny decoder cross)
        assert all(row[part] > 0 for part in ("mllm_s", "denoise_s", "small_first_chunk_s", "small_decode_s"))
        assert row["time_to_first_frames_s"] == pytest.approx(
            row["mllm_s"] + row["denoise_s"] + row["small_first_chunk_s"])
        assert row["turn_with_vae_s"] == pytest.approx(row["mllm_s"] + row["denoise_s"] + fast["vae_decode_s"])
        assert row["turn_s"] > 0 and len(row["raw_turn_s"]) == 1 and row["first_frames"] == 1
        assert row["fp8_layers"] == 0 and row["peak_memory_gb"] is None  # CPU: no FP8, no GPU peak
    # aot_eager runs the same arithmetic: the compiled row's latents are the eager row's
    assert rows["eager"]["latents_vs_eager"] == 0 and rows["compiled"]["latents_vs_eager"] < 1e-5
    assert fast["settings"]["latents"][1] == 3 and fast["settings"]["frames"][0] == 9  # 9 frames from 3 latents
    assert fast["vae_first_frames"] == 9 and fast["denoise_tflop"] > 0
    assert fast["parameters"]["small_decoder"] < fast["parameters"]["vae_decoder"]
    assert len(fast["skipped"]) == 4  # the FP8 rows, the compiled MLLM (not asked for)
    assert fast["writing"]["write_s"] > 0 and len(fast["writing"]["raw_write_s"]) == 3  # imageio-ffmpeg is pinned
    only = import_module("scripts.benchmark").main([
        "--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path / 'only'}", "parts=[fast_path]", "repeats=1",
        "warmup=0", "compile=true", "compile_backend=aot_eager", "fast_path_rows=[compiled]", "student_steps=2"])[
        "fast_path"]
    assert list(only["rows"]) == ["compiled"] and only["rows"]["compiled"]["latents_vs_eager"] is None
    # a 2-step student (the shipped SpriteWorld one): two of the 4-step turn's transformer calls, at t = 999 and 499
    assert len(fast["settings"]["student_timesteps"]) == 4 and only["settings"]["student_timesteps"][0] == 999
    assert len(only["settings"]["student_timesteps"]) == 2
    assert only["denoise_tflop"] == pytest.approx(fast["denoise_tflop"] / 2, rel=1e-9)
    assert "eager: not asked for" in only["skipped"]
    table = markdown(result)
    assert "**The fast turn**" in table and "| compiled |" in table and "Not run: compiled, MLLM compiled" in table
    assert "| eager, dynamic MLLM cache |" in table and "MLLM host syncs" in table
    profile = (out / "profile_fast_turn.txt").read_text()
    assert all(label in profile for label in ("mllm", "denoise", "decode"))


def test_a_vae_that_does_not_fit_leaves_the_fast_turn_measured(tmp_path, monkeypatch):
    """Under a memory cap the VAE's decode (only the comparison column) may not fit beside the game's models: the
    row of the fast turn (small decoder) is still measured, the VAE's columns say why they are missing."""
    from animegamer.game.renderer import DecoderRenderer

    real_decode = DecoderRenderer.decode

    def decode(self, latents):
        if self.small_decoder is None:  # the VAE's path: as torch raises it on a GPU past its cap
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.48 GiB. 24.00 GiB allowed")
        return real_decode(self, latents)

    monkeypatch.setattr(DecoderRenderer, "decode", decode)
    out = tmp_path / "bench"
    result = import_module("scripts.benchmark").main([
        "--preset", "tiny", "--device", "cpu", f"output_dir={out}", "parts=[fast_path]", "repeats=1", "warmup=0",
        "fast_path_rows=[eager]"])
    fast = json.loads((out / "benchmark.json").read_text())["fast_path"]
    assert not result["errors"] and fast["vae_decode_s"] is None and fast["vae_first_frames"] is None
    assert fast["vae_error"].startswith("OutOfMemoryError: CUDA out of memory")
    row = fast["rows"]["eager"]
    assert row["turn_s"] > 0 and row["small_decode_s"] > 0 and row["turn_with_vae_s"] is None
    assert row["time_to_first_frames_with_vae_s"] is None
    assert "not measured: OutOfMemoryError" in (out / "benchmark.md").read_text()
