"""sampling.cache=magcache: calibration (scripts/calibrate_magcache.py) on the tiny models, fewer transformer block
calls with the calibrated ratios, close to the uncached clip, and one-line errors for missing or mismatched ratios."""

import json
from importlib import import_module

import pytest
import torch

from animegamer.config import InferenceConfig, load_config
from animegamer.game.build import build_game
from animegamer.sampling.cache import MagRatios
from animegamer.sampling.denoise import sample as denoise
from animegamer.sampling.presets import PresetSampler
from tests.helpers.game import TINY, tiny_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 10


@pytest.fixture(scope="module")
def calibrated(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path_factory):
    """(overrides of the tiny game at STEPS steps, the ratios file the script wrote)."""
    out = tmp_path_factory.mktemp("magcache")
    overrides = [*tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, out / "play"), f"sampling.steps={STEPS}"]
    torch.set_num_threads(1)
    path = import_module("scripts.calibrate_magcache").main(["--config", str(TINY), "--out", str(out),
                                                              "--prompts", "2", *overrides])
    return overrides, path


def test_calibration_writes_one_ratio_per_step(calibrated):
    _, path = calibrated
    raw = json.loads(path.read_text())
    assert raw["format"] == "animegamer-magcache-v1" and raw["calls"] == STEPS
    assert len(raw["ratios"]) == STEPS and raw["ratios"][0] == 1.0  # the first step has no residual to compare
    assert len(raw["source"]["per_prompt"]) == 2 and all(len(r) == STEPS for r in raw["source"]["per_prompt"])
    assert all(r > 0 for r in raw["ratios"]) and len(set(raw["ratios"])) > 2  # measured, not constants
    assert raw["sampler"].startswith("standard: 10 dpm steps")
    assert MagRatios.load(path, STEPS).ratios == tuple(raw["ratios"])


def test_magcache_skips_blocks_and_stays_close(calibrated):
    overrides, path = calibrated
    cfg = load_config(TINY, overrides, schema=InferenceConfig)
    decoder = build_game(cfg, mllm=False).renderer.decoder
    blocks = decoder.transformer.transformer_blocks
    runs = [0]
    handles = [b.attn1.to_q.register_forward_hook(lambda *_: runs.__setitem__(0, runs[0] + 1)) for b in blocks]
    shots = torch.randn(1, 226, 32, generator=torch.Generator().manual_seed(2))

    def sample(sampling):
        sampler = PresetSampler.build(decoder, sampling)
        runs[0] = 0
        try:
            return sampler.latents(shots, torch.tensor([3]), torch.Generator().manual_seed(4)), runs[0]
        finally:
            sampler.close()

    try:
        reference, full = sample(cfg.sampling)
        cached_cfg = load_config(TINY, [*overrides, "sampling.cache=magcache", f"sampling.magcache_ratios={path}"],
                                 schema=InferenceConfig)  # the default threshold, 0.05
        cached, ran = sample(cached_cfg.sampling)
    finally:
        for handle in handles:
            handle.remove()
    assert full == STEPS * len(blocks)
    assert 0 < ran < full, (ran, full)  # some steps reused the blocks' residual (12 of 20 block calls ran)
    assert torch.isfinite(cached).all()
    assert float((cached - reference).norm() / reference.norm()) < 0.05  # an approximation of the same clip


def test_missing_or_mismatched_ratios_are_one_line_errors(calibrated, tmp_path):
    overrides, path = calibrated
    from animegamer.game.build import check_render_options

    def check(*extra):
        check_render_options(load_config(TINY, [*overrides, "sampling.cache=magcache", *extra],
                                         schema=InferenceConfig), "cpu")

    with pytest.raises(ValueError, match="needs sampling.magcache_ratios"):
        check()
    with pytest.raises(FileNotFoundError, match="not found"):
        check(f"sampling.magcache_ratios={tmp_path / 'none.json'}")
    with pytest.raises(ValueError, match=f"ratios for {STEPS} transformer calls per clip, but this sampler makes 4"):
        check(f"sampling.magcache_ratios={path}", "sampling.steps=4")
    with pytest.raises(ValueError, match="makes 12"):  # the fast preset's 12 steps
        check(f"sampling.magcache_ratios={path}", "sampling.steps=50", "sampling.preset=fast")
    check(f"sampling.magcache_ratios={path}")  # the calibrated settings pass
    bad = tmp_path / "bad.json"
    for text, message in [("{", "not valid JSON"), ('{"format": "other"}', "not a MagCache ratios file"),
                          ('{"format": "animegamer-magcache-v1", "ratios": [1.0, -2]}', "positive finite"),
                          ('{"format": "animegamer-magcache-v1", "ratios": []}', "non-empty")]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            check(f"sampling.magcache_ratios={bad}")


def test_calibration_script_user_errors(tmp_path, capsys):
    script = import_module("scripts.calibrate_magcache")
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--config", str(TINY), "--out", str(tmp_path), "--prompts", "0"])
    assert exit_info.value.code == 2 and "--prompts must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--config", str(TINY), "--out", str(tmp_path), f"game={tmp_path / 'missing.txt'}"])
    assert exit_info.value.code == 2 and "missing.txt" in capsys.readouterr().err


def test_magcache_with_the_fast_preset_keeps_counting_when_guidance_stops(calibrated):
    """fast: guided steps at batch 2 then plain ones at batch 1; MagCache keeps its step count and the residual's
    conditional half (a reset would misalign the ratios)."""
    from animegamer.sampling.cache import TransformerCache, calibrate_mag_ratios
    from animegamer.sampling.presets import effective_sampling

    overrides, _ = calibrated
    cfg = load_config(TINY, [*overrides, "sampling.preset=fast"], schema=InferenceConfig)
    decoder = build_game(cfg, mllm=False).renderer.decoder
    sampling = effective_sampling(cfg.sampling)  # 10 steps, CFG on the first 4
    shots = torch.randn(1, 226, 32, generator=torch.Generator().manual_seed(2))
    batches = []
    handle = decoder.transformer.register_forward_pre_hook(
        lambda m, a, k: batches.append(k["hidden_states"].shape[0]), with_kwargs=True)

    def sample():
        return denoise(decoder, shots, torch.tensor([3]), sampling, generator=torch.Generator().manual_seed(4),
                       decode=False)

    try:
        reference = sample()
        assert batches == [2] * 4 + [1] * 6
        ratios = calibrate_mag_ratios(decoder.transformer, STEPS, [sample, sample])
        assert ratios[0] == ratios[1] and len(ratios[0]) == STEPS  # each clip starts afresh
        cache = TransformerCache(decoder.transformer, "magcache", mag_ratios=MagRatios(tuple(ratios[0])))
        try:
            cached, again = sample(), sample()
        finally:
            cache.remove()
    finally:
        handle.remove()
    assert not torch.equal(cached, reference)  # some steps were skipped
    torch.testing.assert_close(again, cached, rtol=0, atol=0)
    assert float((cached - reference).norm() / reference.norm()) < 0.05
