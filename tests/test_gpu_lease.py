"""research/gpu_lease.py: the GPU measurements in chunks under 10 minutes, each saving its rows; run at tiny size."""

import json
from importlib import import_module

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def lease():
    return import_module("research.gpu_lease")


def test_chunks_fit_a_lease(tmp_path, capsys):
    module = lease()
    assert all(chunk.budget_s < module.CHUNK_LIMIT_S for chunk in module.CHUNKS)
    assert sum(chunk.budget_s for chunk in module.CHUNKS) <= module.LEASE_S
    assert list(module.BY_NAME) == ["mllm", "fast_eager", "fast_compiled", "fast_24gb", "paper_turn", "training"]
    full = module.command(module.BY_NAME["fast_24gb"], tmp_path, "full", "cuda")
    assert full[1:6] == ["scripts/benchmark.py", "--preset", "full", "--device", "cuda"]
    assert f"output_dir={tmp_path / 'fast_24gb'}" in full and full[-2:] == ["--memory-cap-gb", "24.0"]
    tiny = module.command(module.BY_NAME["fast_compiled"], tmp_path, "tiny", "cpu")
    assert "compile_backend=aot_eager" in tiny and "repeats=1" in tiny
    assert module.main(["--list", "--out", str(tmp_path)]) == []
    listed = capsys.readouterr().out
    assert "total 1770 s of a 1800 s lease" in listed and listed.count("\n") == 7
    assert not any(tmp_path.iterdir())  # listing writes nothing


@pytest.mark.parametrize("argv, message", [
    (["--chunk", "fast"], "error: --chunk must be one of"),
    ([], "error: --chunk must be one of"),
])
def test_bad_chunk_is_one_line_error(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        lease().main([*argv, "--out", str(tmp_path), "--device", "cpu", "--preset", "tiny"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith(message) and "\n" not in err
    assert not any(tmp_path.iterdir())


def test_benchmark_refuses_a_negative_memory_cap(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        import_module("scripts.benchmark").main(["--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path}",
                                                  "--memory-cap-gb", "-1"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err == "error: --memory-cap-gb must be >= 0 (got -1.0)"


@pytest.mark.slow
def test_every_chunk_runs_at_tiny_size_and_writes_its_rows(tmp_path):
    records = lease().main(["--chunk", "all", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path)])
    assert [r["chunk"] for r in records] == list(lease().BY_NAME) and all(r["rc"] == 0 for r in records)
    modes = json.loads((tmp_path / "mllm" / "mllm_turn.json").read_text())["modes"]
    assert modes["static"]["host_syncs"] == 1 and modes["static compiled"]["values_equal_dynamic"]
    eager = json.loads((tmp_path / "fast_eager" / "benchmark.json").read_text())["fast_path"]["rows"]
    assert eager["eager"]["mllm_host_syncs"] == 1 and eager["eager, dynamic MLLM cache"]["mllm_host_syncs"] == 8
    compiled = json.loads((tmp_path / "fast_compiled" / "benchmark.json").read_text())["fast_path"]["rows"]
    assert set(compiled) == {"compiled", "compiled, MLLM compiled"}
    assert all("error" not in row for row in compiled.values())
    capped = json.loads((tmp_path / "fast_24gb" / "benchmark.json").read_text())
    assert capped["settings"]["memory_cap"] == {"gb": 24.0, "applied": False,
                                                "why": "no GPU: the cap is a GPU memory fraction"}
    assert "turn" in json.loads((tmp_path / "paper_turn" / "benchmark.json").read_text())
    training = json.loads((tmp_path / "training" / "benchmark.json").read_text())
    assert set(training["training"]) == {"stage_a", "stage_b"} and not training["errors"]
    lines = [json.loads(line) for line in (tmp_path / "lease.jsonl").read_text().splitlines()]
    assert [line["chunk"] for line in lines] == list(lease().BY_NAME)  # one line per chunk run, in order
    assert all(line["rc"] == 0 and line["torch"] for line in lines)
