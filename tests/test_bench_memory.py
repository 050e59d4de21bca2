"""The host-RAM floor (animegamer.bench.memory, research/memory_floor.py) at tiny size: random weights in the real
layouts load through the game's own loaders, each row reports its peak RSS from a fresh process, a row over its
address-space cap is recorded as not fitting, bad input exits 2."""

import json
from importlib import import_module

import pytest
from safetensors import safe_open

from animegamer.bench.memory import ROWS, main, measure_row, peak_rss_bytes, rss_bytes, write_random_pretrained
from animegamer.bench.models import TINY

GIB = 1 << 30
memory_floor = import_module("research.memory_floor")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory_floor")
    sizes = write_random_pretrained(TINY, root, shard_bytes=100_000)  # small shards: the sharded layout is used
    return root, sizes


def test_random_weights_are_written_in_the_layouts_the_loaders_read(tiny_root):
    root, sizes = tiny_root
    index = json.loads((root / "Mistral" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((root / "Mistral" / name).is_file() for name in shards)
    assert 0 < index["metadata"]["total_size"] <= sizes["Mistral"]  # tensors; the files add their headers
    assert "lm_head.weight" in index["weight_map"] and "model.embed_tokens.weight" in index["weight_map"]
    with safe_open(root / "Mistral" / index["weight_map"]["lm_head.weight"], "pt") as fh:
        head = fh.get_tensor("lm_head.weight")
    assert tuple(head.shape) == (TINY.mistral["vocab_size"], TINY.mistral["hidden_size"])
    assert str(head.dtype) == "torch.bfloat16" and 0 < head.float().abs().max() <= 0.0201  # bf16 rounding
    for sub in ("transformer", "vae"):
        assert (root / "CogVideoX" / sub / "config.json").is_file()
        assert (root / "CogVideoX" / sub / "diffusion_pytorch_model.safetensors.index.json").is_file()
    sampler = json.loads((root / "stage_d" / "decoder" / "sampler.json").read_text())
    assert sampler["timesteps"] == [999, 759, 499, 239]  # configs/stage_d.yaml's student
    assert (root / "stage_d" / "decoder" / "adapter_model.safetensors").is_file()
    assert (root / "stage_e" / "small_decoder" / "model.safetensors").is_file()


def test_rows_load_through_the_games_loaders(tiny_root):
    """In this process (the peak is then this test process's, not the row's: only the loading is checked)."""
    root, _ = tiny_root
    for name in ("renderer", "distilled_small"):
        row = measure_row(name, root)
        assert row["row"] == name and row["peak_rss_bytes"] >= row["rss_after_bytes"] > 0, row
    assert peak_rss_bytes() >= rss_bytes() > 0
    with pytest.raises(ValueError, match="unknown row"):
        measure_row("nothing", root)


@pytest.mark.slow
def test_a_row_in_a_fresh_capped_process_and_a_row_over_its_cap(tiny_root):
    root, _ = tiny_root
    run = memory_floor.run_capped(["mllm", "--root", str(root)], 16 * GIB)
    entry = memory_floor.row_entry("mllm", run, 16)
    assert run["returncode"] == 0 and entry["fits"] is True, run
    assert entry["peak_rss_bytes"] >= entry["baseline_rss_bytes"] > 50 << 20  # torch alone is more than 50 MB
    assert run["polled_peak_rss_bytes"] > entry["baseline_rss_bytes"]  # read from /proc while it ran
    # 1 GiB of address space is less than importing torch reserves: the row dies and is recorded as not fitting
    run = memory_floor.run_capped(["mllm", "--root", str(root)], GIB)
    entry = memory_floor.row_entry("mllm", run, 1)
    assert run["returncode"] != 0 and entry["fits"] is False
    assert entry["note"] == "does not fit in 1 GiB of address space"
    table = memory_floor.markdown({"arch": "tiny", "date": "d", "device": "cpu", "torch": "t", "command": "c",
                                   "cap_gib": 1, "rows": {"mllm": entry}})
    assert "| mllm |" in table and "does not fit in 1 GiB" in table


def test_bad_input_exits_2_before_any_model(tmp_path, capsys):
    for argv, message in ((["nothing", "--root", str(tmp_path)], "is not one of"),
                          (["mllm", "--root", str(tmp_path)], "no random weights")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and err.startswith("error: ") and message in err and "\n" not in err, err
    for argv, message in ((["--rows", "mllm,nothing"], "unknown rows"), (["--cap-gib", "0"], "--cap-gib")):
        with pytest.raises(SystemExit) as exc:
            memory_floor.main(["--root", str(tmp_path / "w"), "--out", str(tmp_path / "o"), *argv])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
    assert set(ROWS) == {"mllm", "renderer", "distilled_small", "offload", "stage_a_setup", "stage_b_setup"}
