import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from animegamer.eval.metrics import (
    CLIPScorer,
    DreamSimScorer,
    MetricRecord,
    MetricSettings,
    MetricUnavailable,
    as_frames,
    motion_level_metrics,
    per_turn,
    psnr,
    sample_frame_indices,
    ssim,
    state_metrics,
    summarize,
    try_dreamsim,
)
from animegamer.states import StateValues


def _frames(seed: int, t: int = 4, h: int = 40, w: int = 48) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def scorer(tiny_clip_config):
    return CLIPScorer.from_config(tiny_clip_config)


def test_frame_sampling_and_validation():
    assert sample_frame_indices(17, 4) == [0, 5, 11, 16]
    assert sample_frame_indices(17, 1) == [8]
    assert sample_frame_indices(3, 0) == [0, 1, 2] == sample_frame_indices(3, 5)
    assert as_frames(np.zeros((8, 8, 3), np.uint8)).shape == (1, 8, 8, 3)
    with pytest.raises(ValueError, match="uint8"):
        as_frames(np.zeros((2, 8, 8, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(T, H, W, 3\)"):
        as_frames(np.zeros((2, 3, 8, 8), np.uint8))


def test_clip_i_identical_is_one_and_different_is_less(scorer):
    clip = _frames(0)
    assert scorer.clip_i(clip, clip.copy(), pairing="paired") == pytest.approx(1.0, abs=1e-5)
    one = clip[:1]
    assert scorer.clip_i(one, one, pairing="all") == pytest.approx(1.0, abs=1e-5)
    other = _frames(1)
    different = scorer.clip_i(clip, other, pairing="paired")
    assert -1.0 <= different < 1.0 - 1e-4
    # all-pairs averages every generated x reference pair: the mean of the full cosine matrix
    gen, ref = scorer.image_embeddings(clip), scorer.image_embeddings(other)
    assert scorer.clip_i(clip, other, pairing="all") == pytest.approx((gen @ ref.T).mean().item(), abs=1e-6)
    assert torch.allclose(gen.norm(dim=-1), torch.ones(len(gen)), atol=1e-5)
    with pytest.raises(ValueError, match="equal frame counts"):
        scorer.clip_i(clip, other[:2], pairing="paired")
    with pytest.raises(ValueError, match="pairing"):
        scorer.clip_i(clip, other, pairing="diagonal")


def test_clip_t_is_deterministic_bounded_and_scaled(scorer, tiny_clip_config):
    clip = _frames(2)
    text = "Character: Qiqi; Motion: gently lie down; Background: night bedroom."
    first = scorer.clip_t(clip, text)
    assert first == scorer.clip_t(clip, text)
    assert -1.0 <= first <= 1.0
    assert first != pytest.approx(scorer.clip_t(clip, "Character: Sam; Motion: run; Background: beach."), abs=1e-6)
    scaled = CLIPScorer.from_config(tiny_clip_config, scale=100.0, frames_per_clip=2)
    expected = 100 * (scorer.image_embeddings(clip[[0, 3]]) @ scorer.text_embeddings([text]).T).mean().item()
    assert scaled.clip_t(clip, text) == pytest.approx(expected, abs=1e-4)


def test_motion_level_metrics_on_a_shuffled_set():
    target = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    shuffled = [2, 1, 3, 5, 4, 1, 3, 2, 4, 5]  # errors 1 1 0 1 1 0 1 1 0 0
    assert motion_level_metrics(shuffled, target) == {"acc_f": 0.4, "mae_f": 0.6}
    assert motion_level_metrics(target, target) == {"acc_f": 1.0, "mae_f": 0.0}
    assert motion_level_metrics([5], [1]) == {"acc_f": 0.0, "mae_f": 4.0}
    with pytest.raises(ValueError, match="motion level 6"):
        motion_level_metrics([6], [1])
    with pytest.raises(ValueError, match="equally many"):
        motion_level_metrics([1, 2], [1])


def test_state_metrics_by_hand():
    target = [StateValues(3, 1, 0, -1), StateValues(2, 0, 1, 0), StateValues(4, 1, 1, 1), StateValues(1, 0, 0, 1)]
    predicted = [StateValues(3, 1, 1, -1), StateValues(2, 0, 1, 1), StateValues(4, 0, 1, -1), StateValues(1, 0, 0, 1)]
    out = state_metrics(predicted, target)
    assert out["acc_social"] == 0.75 and out["acc_entertainment"] == 0.75 and out["acc_stamina"] == 0.5
    assert out["acc_s"] == pytest.approx((0.75 + 0.75 + 0.5) / 3)
    assert out["mae_s"] == pytest.approx((0 + 1 + 2 + 0) / 4)


def test_psnr_known_values():
    clip = np.random.default_rng(3).integers(20, 230, (3, 16, 16, 3), dtype=np.uint8)
    assert psnr(clip, clip.copy()) == math.inf
    noise = np.where(np.indices(clip.shape).sum(0) % 2 == 0, 8, -8)  # +-8 everywhere: MSE = 64
    noisy = (clip.astype(int) + noise).astype(np.uint8)
    # torchmetrics keeps ln(255) and 10 / ln(10) in float32: about 1e-6 dB from the exact value
    assert psnr(noisy, clip) == pytest.approx(10 * math.log10(255**2 / 64), abs=1e-5)
    with pytest.raises(ValueError, match="equal shape"):
        psnr(clip, clip[:2])


def _ssim_reference(a: np.ndarray, b: np.ndarray, k: int = 11, sigma: float = 1.5) -> float:
    """A direct loop over every valid window position, for one frame."""
    c = np.arange(k) - (k - 1) / 2
    g = np.exp(-(c**2) / (2 * sigma**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    values = []
    for ch in range(3):
        x, y = a[..., ch].astype(float), b[..., ch].astype(float)
        for i in range(x.shape[0] - k + 1):
            for j in range(x.shape[1] - k + 1):
                px, py = x[i : i + k, j : j + k], y[i : i + k, j : j + k]
                mx, my = (w * px).sum(), (w * py).sum()
                vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
                cov = (w * (px - mx) * (py - my)).sum()
                values.append(((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    return float(np.mean(values))


def test_ssim_identical_constant_and_reference():
    clip = _frames(4, t=2, h=14, w=15)
    assert ssim(clip, clip.copy()) == pytest.approx(1.0, abs=1e-12)
    a = np.full((1, 12, 12, 3), 100, np.uint8)
    b = np.full((1, 12, 12, 3), 120, np.uint8)
    c1 = (0.01 * 255) ** 2  # flat images: only the luminance term differs from 1
    assert ssim(a, b) == pytest.approx((2 * 100 * 120 + c1) / (100**2 + 120**2 + c1), abs=1e-12)
    other = _frames(5, t=1, h=14, w=15)
    assert ssim(clip[:1], other) == pytest.approx(_ssim_reference(clip[0], other[0]), abs=1e-10)
    with pytest.raises(ValueError, match="smaller than the SSIM window"):
        ssim(clip[:, :8], clip[:, :8])
    narrow = _ssim_reference(clip[0], other[0], k=9, sigma=1.1)  # the border cropped is (9 - 1) / 2 wide
    assert ssim(clip[:1], other, window=9, sigma=1.1) == pytest.approx(narrow, abs=1e-10)
    with pytest.raises(ValueError, match="does not match sigma"):
        ssim(clip, clip, window=7)


def test_dreamsim_is_reported_missing_not_faked(tmp_path):
    with pytest.raises(MetricUnavailable, match="no weights directory"):
        DreamSimScorer.from_weights("")
    scorer, reason = try_dreamsim(tmp_path / "no_such_dir")
    assert scorer is None
    try:
        import dreamsim  # noqa: F401

        assert "weights not found" in reason and "no_such_dir" in reason
    except ImportError:
        assert "dreamsim package is not installed" in reason


def _record(game: str, turn: int, clip_i: float | None, acc_f: float, settings: MetricSettings) -> MetricRecord:
    missing = {} if clip_i is not None else {"clip_i": "no reference images"}
    return MetricRecord("animegamer", game, turn, {"clip_i": clip_i, "acc_f": acc_f, "dreamsim": None},
                        {**missing, "dreamsim": "DreamSim: not installed"}, settings)


def test_records_summary_and_per_turn():
    settings = MetricSettings(clip_model="tiny", clip_scale=1.0, flow={"method": "dis", "bins": [0.5, 1, 2, 4]})
    records = [
        _record("g0", 0, 0.5, 1.0, settings),
        _record("g0", 1, 0.7, 0.0, settings),
        _record("g1", 0, 0.9, 1.0, settings),
        _record("g1", 1, None, 1.0, settings),
    ]
    summary = summarize(records)
    assert summary.means["clip_i"] == pytest.approx(0.7) and summary.counts["clip_i"] == 3
    assert summary.means["acc_f"] == 0.75
    assert summary.means["dreamsim"] is None and summary.missing == {"dreamsim": "DreamSim: not installed"}
    assert summary.settings == settings
    assert per_turn(records, "clip_i") == {0: pytest.approx(0.7), 1: pytest.approx(0.7)}
    assert per_turn(records, "acc_f") == {0: 1.0, 1: 0.5}
    # records survive a JSON round trip with their settings
    again = [MetricRecord.from_dict(json.loads(json.dumps(r.to_dict()))) for r in records]
    assert again == records
    other = MetricSettings(clip_model="ViT-H-14", clip_scale=100.0)
    with pytest.raises(ValueError, match="different settings"):
        summarize([*records, _record("g2", 0, 50.0, 1.0, other)])
    with pytest.raises(ValueError, match="several systems"):
        summarize([*records, MetricRecord("gc_baseline", "g0", 0, {"clip_i": 0.1}, settings=settings)])


# --------------------------------------------------------------------------------------------
# Frozen PSNR / SSIM values on real frames (tests/data/pixel_metrics)
# --------------------------------------------------------------------------------------------

PIXEL_DATA = Path(__file__).parent / "data" / "pixel_metrics"


def _hash_noise(shape: tuple[int, ...], amplitude: int, salt: int) -> np.ndarray:
    """Integer noise in [-amplitude, amplitude] from an integer hash of the index: the same on every numpy."""
    h = np.arange(math.prod(shape), dtype=np.uint64) + np.uint64(salt)
    for _ in range(2):  # 32-bit multiply-xorshift rounds
        h = ((h ^ (h >> np.uint64(16))) * np.uint64(0x45D9F3B)) & np.uint64(0xFFFFFFFF)
    h = h ^ (h >> np.uint64(16))
    return (h % np.uint64(2 * amplitude + 1)).astype(np.int64).reshape(shape) - amplitude


def _box_blur(clip: np.ndarray) -> np.ndarray:
    """3 x 3 box filter with replicated edges, rounded half to even (exact in float64)."""
    h, w = clip.shape[1:3]
    padded = np.pad(clip.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    total = sum(padded[:, i : i + h, j : j + w] for i in range(3) for j in range(3))
    return np.round(total / 9).astype(np.uint8)


def _shift(clip: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Content moved down by dy and right by dx pixels, the top and left edges replicated."""
    h, w = clip.shape[1:3]
    return np.pad(clip, ((0, 0), (dy, 0), (dx, 0), (0, 0)), mode="edge")[:, :h, :w]


def pixel_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(generated, reference) pairs of real SpriteWorld frames: the shipped VAE's reconstruction, noise, blur, a
    shift, another shot, one frame alone."""
    clips = np.load(PIXEL_DATA / "clips.npz")
    real, vae = clips["real"], clips["vae"]
    cases = {}
    for i, clip in enumerate(real):
        cases[f"shot{i}/vae"] = (vae[i], clip)
        for amplitude in (8, 40):
            noise = _hash_noise(clip.shape, amplitude, salt=1000 * i + amplitude)
            noisy = np.clip(clip.astype(np.int64) + noise, 0, 255).astype(np.uint8)
            cases[f"shot{i}/noise{amplitude}"] = (noisy, clip)
        cases[f"shot{i}/blur"] = (_box_blur(clip), clip)
        cases[f"shot{i}/shift"] = (_shift(clip, 2, 3), clip)
    cases["shot0/other_shot"] = (real[1], real[0])
    cases["shot2/frame4_vae"] = (vae[2, 4], real[2, 4])  # a single (H, W, 3) image
    return cases


def test_ssim_equals_the_torchmetrics_map_inside_its_border():
    """The two 1-D passes give torchmetrics' SSIM map where its reflect padding does not reach."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (3, 20, 27, 3), dtype=np.uint8)
    near = np.clip(a.astype(int) + rng.integers(-40, 41, a.shape), 0, 255).astype(np.uint8)
    for b in (near, rng.integers(0, 256, a.shape, dtype=np.uint8)):
        for window, sigma in ((11, 1.5), (9, 1.1)):
            x, y = (torch.from_numpy(c).double().permute(0, 3, 1, 2) for c in (a, b))
            _, full = structural_similarity_index_measure(x, y, gaussian_kernel=True, sigma=sigma, data_range=255.0,
                                                          k1=0.01, k2=0.03, return_full_image=True)
            pad = (window - 1) // 2
            inside = full[:, :, pad : 20 - pad, pad : 27 - pad].mean().item()
            assert ssim(a, b, window=window, sigma=sigma) == pytest.approx(inside, abs=1e-12)


def test_psnr_ssim_reproduce_the_frozen_values_on_real_frames():
    """The values our own implementation gave before PSNR / SSIM moved to torchmetrics, on the same frames.

    Tolerances: PSNR within 1e-5 dB (torchmetrics keeps ln(255) and 10 / ln(10) in float32: relative error
    about 1e-7, i.e. at most 5e-6 dB on these values); SSIM within 1e-10 (float64 throughout; only the order of
    the sums differs). The tables print PSNR to 0.01 dB and SSIM to 0.001.
    """
    frozen = json.loads((PIXEL_DATA / "values.json").read_text())["values"]
    cases = pixel_cases()
    assert sorted(cases) == sorted(frozen)
    for name, (generated, reference) in cases.items():
        assert psnr(generated, reference) == pytest.approx(frozen[name]["psnr"], abs=1e-5), name
        assert ssim(generated, reference) == pytest.approx(frozen[name]["ssim"], abs=1e-10), name
    generated, reference = cases["shot1/vae"]
    tensors = torch.from_numpy(generated), torch.from_numpy(reference)
    assert psnr(*tensors) == pytest.approx(frozen["shot1/vae"]["psnr"], abs=1e-5)
    assert ssim(*tensors) == pytest.approx(frozen["shot1/vae"]["ssim"], abs=1e-10)
