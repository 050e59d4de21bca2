"""Motion scope: how much a clip moves, from optical flow, quantised to motion levels 1..5.

For every pair of consecutive frames the flow magnitude ``|(u, v)|`` in pixels per frame is computed (absolute
values: no per-clip normalisation, so a fast clip scores higher than a slow one). Pixels below ``r * m`` are near-
static background and dropped, where ``r = 0.2`` (the paper's relative threshold) and ``m`` is a robust maximum of
that pair: the ``robust_quantile`` (0.99) quantile of the magnitudes rather than the plain maximum, so a handful of
outlier vectors at edges or compression blocks cannot set the bar (``robust_quantile=1`` gives the plain max). The
pair's motion is the mean magnitude of the remaining pixels; the clip's motion scope is the mean over its pairs.

Magnitudes depend on resolution and frame rate, so they are measured on the clips as written (target size, target
fps) and :class:`MotionSettings` records both, along with the flow method; new clips (e.g. generated ones scored
for ACC-F/MAE-F) are resized to the recorded size and scored with the same settings and the dataset's bin edges,
all read from the manifest's meta sidecar (:meth:`MotionSettings.from_meta`, :func:`edges_from_meta`).

Flow: OpenCV DIS by default (no weights); torchvision RAFT (large or small, detected from the state dict) when
``method="raft"`` and its weights file is on disk (safetensors, or a pickle loaded with ``weights_only=True``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from animegamer.models.weights import load_state_dict_file

DIS_PRESETS = ("ultrafast", "fast", "medium")


@dataclass(frozen=True)
class MotionSettings:
    """How motion scope is measured; stored in the manifest meta so every clip is scored the same way."""

    method: str = "dis"  # dis (OpenCV DIS optical flow) | raft (torchvision RAFT, local weights)
    threshold: float = 0.2  # r: pixels below r * robust max of their frame pair are dropped
    robust_quantile: float = 0.99  # the "max" of r * max is this quantile of the pair's magnitudes
    dis_preset: str = "medium"  # DIS speed/quality preset: ultrafast | fast | medium
    raft_weights: str = ""  # RAFT state dict file (method=raft)
    height: int = 0  # frames are resized to height x width before the flow (0 = as given)
    width: int = 0
    fps: float = 0.0  # frame rate the magnitudes are measured at (pixels per frame); informational
    device: str = "cpu"  # RAFT device; not part of the scoring definition

    def __post_init__(self) -> None:
        if self.method not in ("dis", "raft"):
            raise ValueError(f"flow method {self.method!r} is not one of ['dis', 'raft']")
        if self.dis_preset not in DIS_PRESETS:
            raise ValueError(f"dis_preset {self.dis_preset!r} is not one of {list(DIS_PRESETS)}")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"flow threshold r={self.threshold} must be in [0, 1)")
        if not 0.0 < self.robust_quantile <= 1.0:
            raise ValueError(f"robust_quantile={self.robust_quantile} must be in (0, 1]")
        if self.method == "raft" and not Path(self.raft_weights).is_file():
            raise FileNotFoundError(
                f"flow=raft needs the RAFT weights on disk; not found: {self.raft_weights!r} (nothing is downloaded)"
            )

    @classmethod
    def from_config(cls, cfg: Any) -> MotionSettings:
        """From a PrepareDataConfig: flow measured at the clips' size and frame rate."""
        return cls(
            method=cfg.flow,
            threshold=cfg.flow_threshold,
            robust_quantile=cfg.flow_robust_quantile,
            dis_preset=cfg.flow_preset,
            raft_weights=cfg.raft_weights,
            height=cfg.height,
            width=cfg.width,
            fps=float(cfg.fps),
            device=cfg.flow_device,
        )

    def to_meta(self) -> dict[str, Any]:
        """The scoring definition (everything but the device)."""
        meta = asdict(self)
        meta.pop("device")
        return meta

    @classmethod
    def from_meta(cls, meta: dict[str, Any], device: str = "cpu") -> MotionSettings:
        """Settings from a manifest meta dict (the ``"motion"`` entry, or the whole meta)."""
        meta = meta.get("motion", meta)
        names = set(cls.__dataclass_fields__) - {"device"}
        return cls(**{k: v for k, v in meta.items() if k in names}, device=device)


# --------------------------------------------------------------------------------------------
# Optical flow
# --------------------------------------------------------------------------------------------


class DISFlow:
    """OpenCV's Dense Inverse Search flow on grey frames."""

    def __init__(self, preset: str = "medium"):
        import cv2

        code = {
            "ultrafast": cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST,
            "fast": cv2.DISOPTICAL_FLOW_PRESET_FAST,
            "medium": cv2.DISOPTICAL_FLOW_PRESET_MEDIUM,
        }[preset]
        self.dis = cv2.DISOpticalFlow_create(code)

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        """(T, H, W, 3) uint8 RGB -> (T-1, H, W) flow magnitudes in pixels."""
        import cv2

        grey = [cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2GRAY) for f in frames]
        mags = []
        for prev, nxt in zip(grey[:-1], grey[1:], strict=True):
            flow = self.dis.calc(prev, nxt, None)  # (H, W, 2)
            mags.append(np.sqrt(flow[..., 0] ** 2 + flow[..., 1] ** 2))
        return np.stack(mags).astype(np.float32)


class RAFTFlow:
    """torchvision RAFT with local weights; the architecture (large/small) is read off the state dict."""

    def __init__(self, weights: str | Path, device: str = "cpu", batch_pairs: int = 4):
        import torch
        from torchvision.models.optical_flow import raft_large, raft_small

        state = load_state_dict_file(weights)
        for build in (raft_large, raft_small):
            with torch.device("meta"):  # shapes only, to tell the architecture from the state dict
                expected = build(weights=None).state_dict()
            if set(expected) == set(state) and all(expected[k].shape == state[k].shape for k in state):
                model = build(weights=None)
                model.load_state_dict(state)
                break
        else:
            raise ValueError(f"{weights}: not a torchvision raft_large or raft_small state dict")
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.batch_pairs = batch_pairs

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        """(T, H, W, 3) uint8 RGB -> (T-1, H, W) flow magnitudes in pixels."""
        import torch
        import torch.nn.functional as F

        x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()  # (T, 3, H, W)
        x = x / 127.5 - 1.0  # RAFT's expected range [-1, 1]
        h, w = x.shape[-2:]
        # RAFT works on 1/8 resolution feature maps and its correlation pyramid needs them >= 16 wide.
        pad_h, pad_w = max((-h) % 8, 128 - h), max((-w) % 8, 128 - w)
        x = F.pad(x, (0, pad_w, 0, pad_h), mode="replicate")
        mags = []
        with torch.inference_mode():
            for i in range(0, x.shape[0] - 1, self.batch_pairs):
                j = min(i + self.batch_pairs, x.shape[0] - 1)
                a, b = x[i:j].to(self.device), x[i + 1 : j + 1].to(self.device)
                flow = self.model(a, b)[-1][..., :h, :w]  # (P, 2, H, W), last refinement
                mags.append(torch.linalg.vector_norm(flow, dim=1).cpu())  # (P, H, W)
        return torch.cat(mags).numpy().astype(np.float32)


# --------------------------------------------------------------------------------------------
# Scope and levels
# --------------------------------------------------------------------------------------------


def motion_scope(magnitudes: np.ndarray, threshold: float = 0.2, robust_quantile: float = 0.99) -> float:
    """Mean magnitude of the moving pixels of (P, H, W) per-pair flow magnitudes, averaged over pairs."""
    if magnitudes.ndim != 3 or magnitudes.shape[0] == 0:
        raise ValueError(f"expected (pairs, H, W) magnitudes, got shape {magnitudes.shape}")
    scores = []
    for mag in magnitudes:
        peak = float(np.quantile(mag, robust_quantile))
        if peak <= 0.0:
            scores.append(0.0)
            continue
        scores.append(float(mag[mag >= threshold * peak].mean()))
    return float(np.mean(scores))


class MotionScorer:
    """Scores clips with one :class:`MotionSettings`: ``scorer.score(frames) -> motion scope``."""

    def __init__(self, settings: MotionSettings):
        self.settings = settings
        self.flow = (
            DISFlow(settings.dis_preset)
            if settings.method == "dis"
            else RAFTFlow(settings.raft_weights, settings.device)
        )

    def score(self, frames: np.ndarray) -> float:
        """(T, H, W, 3) uint8 RGB frames at the settings' frame rate -> motion scope (pixels per frame)."""
        import cv2

        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[0] < 2 or frames.shape[-1] != 3:
            raise ValueError(f"expected (T >= 2, H, W, 3) frames, got shape {frames.shape}")
        s = self.settings
        if s.height and s.width and frames.shape[1:3] != (s.height, s.width):
            frames = np.stack([cv2.resize(f, (s.width, s.height), interpolation=cv2.INTER_AREA) for f in frames])
        return motion_scope(self.flow(frames), s.threshold, s.robust_quantile)


_SCORERS: dict[MotionSettings, MotionScorer] = {}


def scorer_for(settings: MotionSettings) -> MotionScorer:
    """One scorer per settings per process (RAFT weights load once per worker)."""
    if settings not in _SCORERS:
        _SCORERS[settings] = MotionScorer(settings)
    return _SCORERS[settings]


def fit_motion_bins(values: list[float] | np.ndarray, levels: int = 5) -> list[float]:
    """``levels - 1`` inner bin edges at the quantiles k / levels of ``values``: equally filled levels."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        raise ValueError("cannot fit motion bins: no finite motion values")
    if levels < 2:
        raise ValueError(f"levels={levels} must be at least 2")
    return [float(x) for x in np.quantile(values, np.arange(1, levels) / levels)]


def motion_level(value: float, edges: list[float]) -> int:
    """Level 1..len(edges)+1 of a motion scope; a value equal to an edge goes to the upper level."""
    return int(np.searchsorted(np.asarray(edges), value, side="right")) + 1


def edges_from_meta(meta: dict[str, Any]) -> list[float]:
    """The fitted bin edges stored in a manifest meta dict."""
    try:
        return [float(x) for x in meta["motion"]["edges"]]
    except (KeyError, TypeError) as exc:
        raise KeyError("manifest meta has no motion bin edges (run scripts/prepare_data.py first)") from exc
