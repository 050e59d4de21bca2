"""The benchmark's ``official`` part at tiny sizes on the CPU: release-layout files written, converted by the real
converter in a child process, one turn timed in ``released`` and ``fixed``, through scripts/benchmark.py."""

import json
import math
from importlib import import_module
from pathlib import Path

import pytest
import torch
import yaml

from animegamer.bench.official import measure_conversion, release_sizes, write_release
from animegamer.official.agent import RELEASE_MAX_NEW_TOKENS
from animegamer.official.release_files import sat_model_yaml
from animegamer.official.sat_layout import (
    MODEL_STATES,
    SatDecoderSpec,
    expected_shapes,
    read_model_yaml,
    read_sat_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_release_files_have_the_release_layout(tmp_path):
    sizes = release_sizes("tiny", steps=3)
    files = write_release(tmp_path, "tiny", sizes, seed=0)
    paths = files["paths"]
    ckpt = Path(paths["decoder_dir"])
    assert (ckpt / "latest").read_text() == "1000" and (ckpt / "1000" / MODEL_STATES).is_file()
    spec = read_model_yaml(paths["decoder_yaml"])  # the written YAML reads back as the sizes asked for
    assert spec == sizes.decoder and spec.sample_steps == 3
    _, iteration, state, ignored = read_sat_checkpoint(ckpt, spec)
    assert iteration == 1000 and ignored == 0 and set(state) == set(expected_shapes(spec))
    agent = torch.load(paths["agent_bin"], weights_only=True)
    assert agent["llm.base_model.model.model.layers.2.self_attn.q_proj.lora_A.default.weight"].shape == (8, 32)
    assert agent["output_resampler.proj.2.weight"].shape == (64, 64)  # s_a width = the DiT's hidden size
    assert files["agent_bin_mb"] > 0 and files["decoder_checkpoint_mb"] > 0

    full = release_sizes("full", steps=50)  # the release's sizes (built only where a GPU runs the full preset)
    assert (full.decoder.hidden_size, full.decoder.num_layers, full.decoder.lora_rank) == (1920, 30, 64)
    assert (full.mistral["hidden_size"], full.mistral["num_hidden_layers"], full.lora_rank) == (4096, 32, 32)
    assert full.sat_dtype == torch.float16
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(sat_model_yaml(full.decoder)))
    assert read_model_yaml(tmp_path / "full.yaml") == SatDecoderSpec()  # the released cogvideox_2b.yaml's values


def test_a_failing_conversion_is_reported_in_one_line(tmp_path):
    with pytest.raises(RuntimeError, match="the conversion failed: .*nothing to convert"):
        measure_conversion("animegamer.official.convert:convert_release", {"out": str(tmp_path / "out")})


def test_official_part_writes_every_field(tmp_path):
    script = import_module("scripts.benchmark")
    threads = torch.get_num_threads()
    try:
        script.main(["--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path}", "parts=[official]",
                     "warmup=0", "repeats=1", "sampling.steps=3"])
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert data["errors"] == {} and "turn" not in data
    off = data["official"]
    conv = off["conversion"]
    assert conv["seconds"] > 0 and conv["rss_mb"] >= conv["anon_mb"] > 0 and conv["converted_mb"] > 0
    released, fixed = off["released"], off["fixed"]
    for mode in (released, fixed):
        for key in ("mllm_s", "denoise_s", "vae_decode_s", "turn_s", "peak_memory_gb"):
            assert math.isfinite(mode[key]) and mode[key] > 0, key
        assert mode["turn_s"] == pytest.approx(mode["mllm_s"] + mode["denoise_s"] + mode["vae_decode_s"])
        # 3 steps, each with both CFG rows in one call (the release's sampler batches them too)
        assert mode["transformer_calls"] == 3 and mode["transformer_rows"] == 6
        assert 1 <= mode["motion_level"] <= 5
    # released: a shot pass, a prefill, then one pass per generated token but an EOS (up to 200 tokens)
    passes = released["llm_forward_passes"]
    assert 3 <= passes <= RELEASE_MAX_NEW_TOKENS + 2
    assert len(released["release_values"]) == 4
    # fixed: one prefill, 3 cached steps for the later fields, the frame-block shot pass
    assert fixed["llm_forward_passes"] == 5 and fixed["release_values"] is None
    assert released["vae_decode_s"] == fixed["vae_decode_s"]  # one call, timed once
    assert list(off["speedup"]) == ["mllm", "denoise", "turn"]
    for key, value in off["speedup"].items():
        assert math.isfinite(value) and value > 0, key
    assert off["speedup"]["turn"] == pytest.approx(released["turn_s"] / fixed["turn_s"])
    assert off["settings"]["released_decoder_dtype"] == "fp16" and off["settings"]["steps"] == 3
    assert "stand" in off["note"] and "cannot run here" in off["note"]
    table = (tmp_path / "benchmark.md").read_text()
    assert "**Official release weights**" in table
    assert f"| {passes} / 5 LLM forward passes |" in table


def test_full_size_needs_a_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        import_module("scripts.benchmark").main(
            ["--preset", "full", "--device", "cpu", "parts=[official]", f"output_dir={tmp_path}"]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: parts=[official] at --preset full") and "\n" not in err
    assert not (tmp_path / "benchmark.json").exists()
