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
    assert sum(chunk.budget_s for chunk in module.CHUNKS) == 3060
    assert module.LEASE_S == 900 and module.plan_leases(900) == 4 and module.plan_leases(1800) == 2
    assert module.plan_leases(3060) == 1 and module.plan_leases(570) == 7  # first fit, in order
    assert list(module.BY_NAME) == ["mllm", "fast_eager", "fast_compiled", "fast_24gb", "fast_2step", "paper_turn",
                                    "training", "engines_a", "engines_b"]
    full = module.command(module.BY_NAME["fast_24gb"], tmp_path, "full", "cuda")
    assert full[1:6] == ["scripts/benchmark.py", "--preset", "full", "--device", "cuda"]
    assert f"output_dir={tmp_path / 'fast_24gb'}" in full and full[-2:] == ["--memory-cap-gb", "24.0"]
    tiny = module.command(module.BY_NAME["fast_compiled"], tmp_path, "tiny", "cpu")
    assert "compile_backend=aot_eager" in tiny and "repeats=1" in tiny
    assert module.main(["--list", "--out", str(tmp_path)]) == []
    listed = capsys.readouterr().out
    assert "total 3060 s: 4 lease(s) of 900 s" in listed and listed.count("\n") == 10
    assert module.main(["--list", "--lease-s", "1800", "--out", str(tmp_path)]) == []
    assert capsys.readouterr().out.endswith("total 3060 s: 2 lease(s) of 1800 s\n")
    assert not any(tmp_path.iterdir())  # listing writes nothing


@pytest.mark.parametrize("argv, message", [
    (["--chunk", "fast"], "error: --chunk must be one of"),
    ([], "error: --chunk must be one of"),
    (["--chunk", "mllm", "--lease-s", "300"], "error: --lease-s 300 is shorter than the longest chunk (570 s)"),
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


@pytest.mark.parametrize("preset, device", [("full", "cpu"), ("tiny", "cpu")])  # cuda: parse needs a GPU
def test_every_benchmark_chunk_is_a_valid_benchmark_command(preset, device, tmp_path):
    """Each chunk that runs scripts/benchmark.py passes its parser (keys, values, parts) with rows it knows, at both
    sizes: a chunk's command fails on the lent GPU only for what a GPU does. (Each part itself runs at tiny size in
    tests/test_benchmark_script.py and tests/test_bench_fast_path.py; two whole chunks run below.)"""
    from animegamer.bench.fastpath import ROWS

    module, benchmark = lease(), import_module("scripts.benchmark")
    for chunk in module.CHUNKS:
        argv = module.command(chunk, tmp_path, preset, device)
        if chunk.script == "research/train_engines.py":
            engines = import_module("research.train_engines")
            assert argv[argv.index("--out") + 1] == str(tmp_path / chunk.name), chunk.name
            if preset == "full":  # parsed on a GPU only (it counts the devices): DDP, FSDP2 and ZeRO-3 at full size
                assert argv[argv.index("--engines") + 1] == "ddp,fsdp2,zero3" and "--steps" not in argv, chunk.name
                continue
            settings = engines.parse_args(argv[2:])
            assert (settings.preset, settings.device, settings.stages) == (preset, device, (chunk.name[-1],))
            assert settings.engines == ("ddp", "zero3") and settings.num_processes == 2, chunk.name
            continue
        if chunk.script != "scripts/benchmark.py":
            assert chunk.name == "mllm" and argv[1] == "research/mllm_host_overhead.py"
            continue
        cfg, cap_gb = benchmark.parse(argv[2:])
        assert (cfg.preset, cfg.device, cap_gb) == (preset, device, chunk.memory_cap_gb), chunk.name
        assert cfg.student_steps == (2 if chunk.name == "fast_2step" else 4), chunk.name
        assert cfg.output_dir == str(tmp_path / chunk.name), chunk.name
        assert set(cfg.fast_path_rows) <= {r.name for r in ROWS}, chunk.name
    assert not any(tmp_path.iterdir())  # parsing writes nothing


@pytest.mark.slow
def test_chunks_run_at_tiny_size_and_write_their_rows(tmp_path):
    """Two whole chunks through the lease driver: the MLLM probe (research/mllm_host_overhead.py, which no other test
    runs) and the fast turn under a memory cap; one lease.jsonl line per chunk run, appended in order."""
    records = [*lease().main(["--chunk", "mllm", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path)]),
               *lease().main(["--chunk", "fast_24gb", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path)])]
    assert [r["chunk"] for r in records] == ["mllm", "fast_24gb"] and all(r["rc"] == 0 for r in records)
    modes = json.loads((tmp_path / "mllm" / "mllm_turn.json").read_text())["modes"]
    assert modes["static"]["host_syncs"] == 1 and modes["static compiled"]["values_equal_dynamic"]
    capped = json.loads((tmp_path / "fast_24gb" / "benchmark.json").read_text())
    assert capped["settings"]["memory_cap"] == {"gb": 24.0, "applied": False,
                                                "why": "no GPU: the cap is a GPU memory fraction"}
    assert set(capped["fast_path"]["rows"]) == {"compiled"} and "error" not in capped["fast_path"]["rows"]["compiled"]
    lines = [json.loads(line) for line in (tmp_path / "lease.jsonl").read_text().splitlines()]
    assert [line["chunk"] for line in lines] == ["mllm", "fast_24gb"]
    assert all(line["rc"] == 0 and line["torch"] and line["preset"] == "tiny" for line in lines)
