"""``init_transformer``: SpriteWorld's base transformer pretraining can start from a trained transformer (more
steps for it); a folder that is not this architecture's safetensors weights is one line, before anything is written.
``transformer_cycles`` below 1 is refused the same way (its bit-for-bit check against chained runs is in the mini
chain, ``tests/test_train_spriteworld.py``)."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from animegamer.config import load_config
from animegamer.spriteworld.pretrain_transformer import (
    WEIGHTS_FILE,
    InitTransformerError,
    build_transformer,
    init_weights,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "spriteworld" / "pretrain.yaml"


def _config(*overrides: str):
    return load_config(CONFIG, list(overrides))


def _write(folder: Path, weights: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / WEIGHTS_FILE))
    return folder


def test_no_init_is_the_seeded_random_init():
    assert init_weights(_config()) is None


def test_the_weights_of_the_same_architecture_are_read_back_exactly(tmp_path):
    trained = {k: torch.randn_like(v) for k, v in build_transformer(_config()).state_dict().items()}
    folder = _write(tmp_path / "transformer", trained)
    weights = init_weights(_config(f"init_transformer={folder}"))
    assert weights.keys() == trained.keys()
    for name, tensor in trained.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=0)
    model = build_transformer(_config())
    model.load_state_dict(weights, strict=True)  # what train_transformer does with them
    torch.testing.assert_close(model.proj_out.weight, trained["proj_out.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("case", ["missing", "fewer_layers", "extra", "shape", "integer", "not_safetensors", "dir"])
def test_not_this_architecture_is_one_line(tmp_path, case):
    state = build_transformer(_config()).state_dict()
    folder = tmp_path / "transformer"
    if case == "missing":
        folder.mkdir()
        match = "no such file"
    elif case == "fewer_layers":
        _write(folder, build_transformer(_config("num_layers=1")).state_dict())
        match = "not this architecture: no tensor transformer_blocks.1"
    elif case == "extra":
        _write(folder, {**state, "extra.weight": torch.zeros(2)})
        match = "an unknown tensor extra.weight"
    elif case == "shape":
        _write(folder, {**state, "proj_out.weight": torch.zeros(3, 3)})
        match = r"proj_out.weight is \(3, 3\)"
    elif case == "integer":
        _write(folder, {**state, "proj_out.bias": torch.zeros(state["proj_out.bias"].shape, dtype=torch.int64)})
        match = "not floating point"
    elif case == "not_safetensors":
        folder.mkdir()
        (folder / WEIGHTS_FILE).write_bytes(b"\x80\x04 not a safetensors file")
        match = "init_transformer="
    else:
        (folder / WEIGHTS_FILE).mkdir(parents=True)
        match = "is a directory"
    with pytest.raises(InitTransformerError, match=match) as info:
        init_weights(_config(f"init_transformer={folder}"))
    assert "\n" not in str(info.value) and str(info.value).startswith(f"init_transformer={folder}")


def test_the_script_stops_in_one_line_before_writing_anything(tmp_path, capsys):
    report, out = tmp_path / "report", tmp_path / "CogVideoX"
    with pytest.raises(SystemExit) as stop:
        import_module("scripts.spriteworld.pretrain").main([
            "--config", str(CONFIG), f"init_transformer={tmp_path / 'nowhere'}",
            f"report_dir={report}", f"output_dir={out}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: init_transformer=") and "no such file" in err and len(err.splitlines()) == 1
    assert not report.exists() and not out.exists()


@pytest.mark.parametrize("cycles", ["0", "-1"])
def test_fewer_than_one_transformer_cycle_is_refused(cycles, tmp_path, capsys):
    from animegamer.config import ConfigError

    with pytest.raises(ConfigError, match=f"transformer_cycles={cycles} must be >= 1"):
        _config(f"transformer_cycles={cycles}")
    report = tmp_path / "report"
    with pytest.raises(SystemExit) as stop:
        import_module("scripts.spriteworld.pretrain").main([
            "--config", str(CONFIG), f"transformer_cycles={cycles}", f"report_dir={report}",
            f"output_dir={tmp_path / 'CogVideoX'}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "transformer_cycles" in err and len(err.splitlines()) == 1
    assert not report.exists()
