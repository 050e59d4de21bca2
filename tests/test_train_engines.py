"""research/train_engines.py: the stage scripts under each engine, measured from their own logs; run at tiny size on
CPU processes (DeepSpeed's CPU accelerator), the GPU commands checked without a GPU."""

import json
from importlib import import_module
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


def engines():
    return import_module("research.train_engines")


@pytest.mark.parametrize("argv, message", [
    (["--engines", "ddp,horovod"], "error: --engines takes a comma-separated list of"),
    (["--stages", "c"], "error: --stages takes a comma-separated list of"),
    (["--engines", "fsdp2"], "error: fsdp2 needs CUDA GPUs"),
    (["--steps", "3", "--log-every", "2"], "error: --steps must be at least two logged intervals"),
    (["--preset", "full"], "error: --preset full trains 2B and 7B models: use --device cuda"),
    (["--clips", "0"], "error: --clips and --timeout must be positive"),
])
def test_bad_arguments_are_one_line_errors_before_anything_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        engines().main(["--out", str(out), "--preset", "tiny", "--device", "cpu", "--work", str(tmp_path / "w"),
                        "--engines", "zero3", *argv])  # a case's own --engines comes later and wins
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith(message) and "\n" not in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("processes", [1, 4])
def test_gpu_launches_use_each_engines_shipped_config_and_valid_overrides(tmp_path, processes):
    """At full size on GPUs (built without one): DDP is single_gpu.yaml on one GPU and multi_gpu.yaml on more, FSDP2
    wraps the decoder's blocks in stage (a) and Mistral's layers in stage (b), the config's own mixed precision
    (bf16) is kept, and every key=value the run gets is one the stage's config schema takes."""
    module = engines()
    settings = module.Settings("full", "cuda", ("a", "b"), ("ddp", "fsdp2", "zero3"), processes, 20, 5, 8,
                               tmp_path / "work", tmp_path / "out", 900)
    want = {("a", "ddp"): "single_gpu.yaml" if processes == 1 else "multi_gpu.yaml",
            ("b", "ddp"): "single_gpu.yaml" if processes == 1 else "multi_gpu.yaml",
            ("a", "fsdp2"): "fsdp_decoder.yaml", ("b", "fsdp2"): "fsdp.yaml",
            ("a", "zero3"): "deepspeed_zero3.yaml", ("b", "zero3"): "deepspeed_zero3.yaml"}
    for (stage, engine), config in want.items():
        argv = module.launch_command(settings, stage, engine)
        assert argv[argv.index("--config_file") + 1] == f"configs/accelerate/{config}"
        assert (ROOT / "configs" / "accelerate" / config).is_file()
        assert argv[argv.index("--num_processes") + 1] == str(processes) and "--mixed_precision" not in argv
        script = argv.index(f"scripts/train_stage_{stage}.py")
        assert argv[script + 2] == f"configs/stage_{stage}.yaml"
        cfg = module.stage_config(settings, stage, argv[script + 3:])  # unknown keys would raise
        assert cfg.train.max_steps == 20 and cfg.train.log_every == 5 and cfg.train.mixed_precision == "bf16"
        assert cfg.output_dir == str(tmp_path / "work" / "runs" / f"{stage}_{engine}")
        assert module.child_env(settings, engine).get("DS_ACCELERATOR") is None
    assert not any(tmp_path.iterdir())


def test_speed_leaves_out_the_first_interval():
    summary = engines().summarise({"steps_per_s": {5: 0.5, 10: 2.0, 15: 4.0, 20: 3.0},
                                   "loss": {5: 2.0, 20: 1.5}, "peak_gpu_memory_gb": {5: 10.0, 20: 12.5}}, 5)
    assert summary["steps_per_s"] == 3.0 and summary["intervals"] == 3
    assert summary["peak_gpu_memory_gb"] == 12.5 and (summary["first_loss"], summary["last_loss"]) == (2.0, 1.5)
    assert summary["last_logged_step"] == 20 and summary["tokens_per_s"] is None


@pytest.mark.slow
def test_stages_train_under_zero3_and_their_rows_are_written(tmp_path):
    """Stage (a) and (b) under ZeRO-3 on 2 CPU processes, 4 steps each: one row per run with the speed and memory
    the run logged, MFU from the FLOPs counted on the meta device (stage (a)'s equal to a count on the real tiny
    model), the runs' logs kept in --out and their checkpoints left under --work; the inputs are written once."""
    from animegamer.bench.models import TINY, build_decoder, build_encoder
    from animegamer.bench.timing import count_flops
    from animegamer.bench.training import stage_a_batch
    from animegamer.recipes.stage_a import EncoderDecoder, compute_loss

    module, out, work = engines(), tmp_path / "out", tmp_path / "work"
    result = module.main(["--out", str(out), "--preset", "tiny", "--device", "cpu", "--engines", "zero3",
                          "--steps", "4", "--log-every", "2", "--work", str(work)])
    assert json.loads((out / "engines.json").read_text()) == json.loads(json.dumps(result))
    assert result["format"] == "animegamer_train_engines" and result["peak_flops"] > 0
    assert [(r["stage"], r["engine"], r["rc"]) for r in result["rows"]] == [("a", "zero3", 0), ("b", "zero3", 0)]
    for row in result["rows"]:
        assert row["distributed_type"] == "DistributedType.DEEPSPEED" and row["deepspeed"]["zero_stage"] == 3
        assert row["num_processes"] == 2 and row["intervals"] == 1 and row["steps_per_s"] > 0
        assert row["samples_per_s"] == pytest.approx(row["steps_per_s"] * row["samples_per_step"])
        assert row["samples_per_step"] == 2 * 2  # batch 2 per process, 2 processes
        assert row["mfu"] == pytest.approx(row["flops_per_sample"] * row["samples_per_s"] / (2 * result["peak_flops"]))
        assert 0 < row["mfu"] < 1 and row["peak_gpu_memory_gb"] is None  # no GPU: nothing logged, nothing made up
        assert 0.1 < row["peak_host_rss_gb"] < 8 and torch.isfinite(torch.tensor(row["last_loss"]))
        assert row["last_logged_step"] == 4
        kept = out / "runs" / f"{row['stage']}_zero3"
        assert sorted(p.name for p in kept.iterdir()) == ["launch.log", "metrics.csv", "run_info.json"]
        assert (work / "runs" / f"{row['stage']}_zero3" / "checkpoints" / "latest").is_file()
    table = (out / "engines.md").read_text()
    assert "| (a) | zero3 |" in table and "| (b) | zero3 |" in table and table.count(" | ok |") == 2

    settings = module.parse_args(["--out", str(out), "--preset", "tiny", "--device", "cpu", "--work", str(work),
                                  "--engines", "zero3"])
    cfg = module.stage_config(settings, "a", module.data_overrides(settings, "a"))
    model = EncoderDecoder(build_encoder(TINY, cfg.encoder, "cpu"), build_decoder(TINY, cfg.decoder, "cpu", False))
    one = {k: v[:1] for k, v in stage_a_batch(TINY, cfg, "cpu").items()}
    with torch.no_grad():
        assert result["rows"][0]["flops_per_sample"] == 3 * count_flops(lambda: compute_loss(model, model, one, cfg))
    assert module.write_inputs(settings) == {}  # weights and data are there: nothing rewritten
