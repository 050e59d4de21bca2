import numpy as np
import pytest

from animegamer.data.motion import (
    MotionScorer,
    MotionSettings,
    edges_from_meta,
    fit_motion_bins,
    motion_level,
    motion_scope,
)
from tests.helpers.synthetic_films import moving_patch_frames, texture


@pytest.mark.parametrize("preset", ["fast", "medium"])
def test_scope_is_the_absolute_displacement_of_a_global_shift(preset):
    scene = texture(60, 120, seed=3)
    scorer = MotionScorer(MotionSettings(dis_preset=preset))
    for shift in (1, 2, 3):
        frames = np.stack([scene[4:52, 8 + shift * t : 8 + shift * t + 64] for t in range(7)])  # (7, 48, 64, 3)
        assert scorer.score(frames) == pytest.approx(shift, abs=0.15)
    assert scorer.score(np.stack([scene[:48, :64]] * 4)) < 0.05  # a still shot


def test_levels_ordered_like_the_true_speeds():
    speeds = [0.5, 1.0, 2.0, 3.0, 4.0]  # px per frame of a square over a still background
    scorer = MotionScorer(MotionSettings(dis_preset="fast"))
    scores = [scorer.score(moving_patch_frames(17, 48, 64, v, seed=i)) for i, v in enumerate(speeds)]
    assert np.all(np.diff(scores) > 0), scores
    edges = fit_motion_bins(scores, levels=5)
    assert [motion_level(s, edges) for s in scores] == [1, 2, 3, 4, 5]


def test_relative_threshold_drops_static_pixels_and_ignores_outliers():
    mags = np.zeros((2, 10, 10), np.float32)
    mags[:, :3, :3] = 5.0  # a moving object of 9 pixels over a static background
    assert motion_scope(mags, threshold=0.2) == pytest.approx(5.0)
    assert motion_scope(mags, threshold=0.0, robust_quantile=1.0) == pytest.approx(5.0 * 9 / 100)
    mags[:, :, :] += 0.5  # background jitter below 0.2 * 5.5 stays out
    assert motion_scope(mags, threshold=0.2) == pytest.approx(5.5)
    noisy = np.full((1, 100, 100), 2.0, np.float32)
    noisy[0, 0, 0] = 1000.0  # one wild vector must not raise the bar above the real motion
    assert motion_scope(noisy, 0.2, robust_quantile=0.99) == pytest.approx((2.0 * 9999 + 1000) / 10000)
    assert motion_scope(noisy, 0.2, robust_quantile=1.0) == pytest.approx(1000.0)
    assert motion_scope(np.zeros((3, 4, 4)), 0.2) == 0.0


def test_bins_and_levels():
    edges = fit_motion_bins(np.arange(1, 11), levels=5)
    assert edges == pytest.approx([2.8, 4.6, 6.4, 8.2])
    assert [motion_level(v, edges) for v in (0.0, 2.8, 3.0, 8.2, 100.0)] == [1, 2, 2, 5, 5]
    assert len(fit_motion_bins([1.0, 2.0], levels=3)) == 2
    with pytest.raises(ValueError, match="no finite"):
        fit_motion_bins([float("nan")])


def test_settings_round_trip_through_meta_and_fixed_size():
    settings = MotionSettings(dis_preset="fast", height=24, width=32, fps=8.0)
    meta = {"motion": {**settings.to_meta(), "edges": [0.1, 0.2, 0.3, 0.4]}}
    assert "device" not in meta["motion"]
    assert MotionSettings.from_meta(meta) == settings
    assert edges_from_meta(meta) == [0.1, 0.2, 0.3, 0.4]
    with pytest.raises(KeyError, match="prepare_data"):
        edges_from_meta({})
    # Clips of another size are resized to the recorded size first: a 2 px shift at 48x64 is 1 px at 24x32.
    scene = texture(60, 120, seed=5)
    frames = np.stack([scene[4:52, 8 + 2 * t : 72 + 2 * t] for t in range(5)])
    assert MotionScorer(settings).score(frames) == pytest.approx(1.0, abs=0.2)
    with pytest.raises(FileNotFoundError, match="raft"):
        MotionSettings(method="raft", raft_weights="missing.safetensors")
    with pytest.raises(ValueError, match="threshold"):
        MotionSettings(threshold=1.5)


def test_raft_from_local_safetensors(tmp_path, request):
    import torch
    from torchvision.models.optical_flow import raft_small

    from animegamer.models.weights import save_state_dict_file

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two OpenMP threads on two busy cores make RAFT ~20x slower
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.manual_seed(0)
    save_state_dict_file(raft_small(weights=None).state_dict(), tmp_path / "raft_small.safetensors")
    scorer = MotionScorer(MotionSettings(method="raft", raft_weights=str(tmp_path / "raft_small.safetensors")))
    flow = scorer.flow(moving_patch_frames(2, 48, 64, 2.0))  # padded to RAFT's minimum size and cropped back
    assert flow.shape == (1, 48, 64) and np.isfinite(flow).all() and flow.std() > 0
    save_state_dict_file({"weight": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="raft_large or raft_small"):
        MotionScorer(MotionSettings(method="raft", raft_weights=str(tmp_path / "other.safetensors")))
