"""research/spriteworld/stage_d_inputs.py: features with or without figure masks, refused when they disagree."""

from __future__ import annotations

from importlib import import_module

import pytest
import torch

from animegamer.data.tensor_store import TensorStore

stage_d_inputs = import_module("research.spriteworld.stage_d_inputs")


def _store(root, masks: bool) -> TensorStore:
    store = TensorStore(root)
    clip = {"latents": torch.zeros(2, 4, 3, 3), "text_tokens": torch.zeros(5, 8)}
    if masks:
        clip["figure_mask"] = torch.ones(2, 3, 3, dtype=torch.uint8)
    store.write_shard({"film_000/clip_000": clip})
    return store


def test_has_figure_masks_reads_the_first_clip(tmp_path):
    assert not stage_d_inputs.has_figure_masks(tmp_path / "none")  # no store yet
    _store(tmp_path / "plain", masks=False)
    _store(tmp_path / "masked", masks=True)
    assert not stage_d_inputs.has_figure_masks(tmp_path / "plain")
    assert stage_d_inputs.has_figure_masks(tmp_path / "masked")


def _run_dir(tmp_path, features):
    run, ship = tmp_path / "run", tmp_path / "ship"
    (run / "configs").mkdir(parents=True)
    (run / "data").mkdir()
    (run / "data" / "train.jsonl").write_text("")
    (run / "configs" / "pretrain.yaml").write_text(f"kind: spriteworld_pretrain\ndata:\n  features_dir: {features}\n")
    for part in ("stage_b", "stage_c", "clip", "CogVideoX", "Mistral"):
        (ship / part).mkdir(parents=True)
    return run, ship


def test_figure_masks_asked_of_features_without_them_is_a_one_line_error(tmp_path):
    features = tmp_path / "features"
    _store(features, masks=False)
    run, ship = _run_dir(tmp_path, features)
    with pytest.raises(SystemExit, match=r"^error: .*features holds features without figure masks"):
        stage_d_inputs.main(["--run-dir", str(run), "--ship-dir", str(ship), "--upto", "features", "--figure-masks"])
    assert TensorStore(features).clip_ids() == ["film_000/clip_000"]  # left as it was


def test_features_already_there_stop_at_upto_features(tmp_path, capsys):
    features = tmp_path / "features"
    _store(features, masks=True)
    run, ship = _run_dir(tmp_path, features)
    got = stage_d_inputs.main(["--run-dir", str(run), "--ship-dir", str(ship), "--upto", "features",
                               "--figure-masks"])
    assert got == features and "(with figure masks)" in capsys.readouterr().out
    assert sorted(p.name for p in (run / "models").iterdir()) == ["CogVideoX", "Mistral", "clip"]
