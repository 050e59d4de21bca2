"""The paper's metrics on generated animation shots, and the record that carries them.

Frames are uint8 arrays (or tensors) of shape (T, H, W, 3); a single image (H, W, 3) counts as T = 1.

- **CLIP-I** (:meth:`CLIPScorer.clip_i`): cosine similarity of normalised ``encode_image`` embeddings of a full
  open_clip model between generated frames and reference frames (character consistency). ``pairing="all"`` averages
  over every (generated, reference) pair, for reference *images* of the character; ``pairing="paired"`` compares
  frame t with frame t, for a ground-truth clip of the same length.
- **CLIP-T** (:meth:`CLIPScorer.clip_t`): cosine similarity between each generated frame's image embedding and the
  turn instruction's text embedding (open_clip tokenizer of the same architecture), averaged over frames.
- **DreamSim** (:class:`DreamSimScorer`): perceptual *distance* (lower is better) from the ``dreamsim`` package with
  local weights; an optional extra, reported as missing (:class:`MetricUnavailable`) when absent, never faked.
- **ACC-F / MAE-F** (:func:`motion_level_metrics`): accuracy and mean absolute error of motion levels (1..5) measured
  on generated clips against the ground truth; **ACC-S / MAE-S** (:func:`state_metrics`): accuracy of the predicted
  social / entertainment / stamina values and the stamina error.
- **PSNR / SSIM** (:func:`psnr`, :func:`ssim`): pixel metrics between a generated and a reference clip of equal shape.

Raw CLIP scores are cosines in [-1, 1]; :class:`CLIPScorer` multiplies by ``scale`` (1 = raw cosine, 100 = the
"CLIPScore" convention of many video papers), and :class:`MetricSettings` records which scale, CLIP model, frames and
flow settings produced every :class:`MetricRecord`, so numbers from different settings are never averaged together.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from animegamer.config import CLIPConfig
from animegamer.models.clip_image import load_open_clip
from animegamer.states import VALUE_RANGES, StateValues


class MetricUnavailable(RuntimeError):
    """A metric cannot be computed here (optional package or weights missing); the message says why."""


@dataclass(frozen=True)
class MetricInfo:
    label: str  # column name in the paper's tables
    higher_is_better: bool
    description: str


METRICS: dict[str, MetricInfo] = {
    "clip_i": MetricInfo("CLIP-I", True, "CLIP image-image cosine, generated vs reference frames"),
    "dreamsim": MetricInfo("DreamSim", False, "DreamSim perceptual distance, generated vs reference frames"),
    "clip_t": MetricInfo("CLIP-T", True, "CLIP image-text cosine, generated frames vs the turn instruction"),
    "acc_f": MetricInfo("ACC-F", True, "motion level of the generated clip equals the ground truth"),
    "mae_f": MetricInfo("MAE-F", False, "absolute motion level error of the generated clip"),
    "acc_s": MetricInfo("ACC-S", True, "mean accuracy of the predicted social, entertainment and stamina values"),
    "mae_s": MetricInfo("MAE-S", False, "absolute error of the predicted stamina delta"),
    "psnr": MetricInfo("PSNR", True, "peak signal-to-noise ratio (dB) over the whole clip, uint8 range"),
    "ssim": MetricInfo("SSIM", True, "structural similarity, Gaussian window 11 / sigma 1.5, mean over frames"),
    "friend_named": MetricInfo("Friend-N", True, "the friend the instruction names is the second character drawn"),
    "friend_remembered": MetricInfo("Friend-R", True, "the friend only earlier shots show is the one drawn"),
    "hero_on_screen": MetricInfo("Hero", True, "the protagonist is drawn"),
    "judge_overall": MetricInfo("Overall", True, "LLM judge, 1..10: overall quality of the game"),
    "judge_instruction_following": MetricInfo("Instr.", True, "LLM judge, 1..10: clips follow their instructions"),
    "judge_contextual_coherence": MetricInfo("Coher.", True, "LLM judge, 1..10: turns continue one story"),
    "judge_character_consistency": MetricInfo("Char.", True, "LLM judge, 1..10: the character keeps its look"),
}


# --------------------------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------------------------


def as_frames(frames: np.ndarray | torch.Tensor) -> np.ndarray:
    """Validate and return uint8 frames as a numpy array (T, H, W, 3); a single (H, W, 3) image becomes T = 1."""
    array = frames.detach().cpu().numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or array.shape[-1] != 3 or array.shape[0] == 0:
        raise ValueError(f"expected frames of shape (T, H, W, 3), got {array.shape}")
    if array.dtype != np.uint8:
        raise ValueError(f"expected uint8 frames, got {array.dtype}")
    return array


def sample_frame_indices(num_frames: int, count: int) -> list[int]:
    """``count`` evenly spaced frame indices including the first and last frame; ``count <= 0`` = every frame."""
    if num_frames <= 0:
        raise ValueError("a clip needs at least one frame")
    if count <= 0 or count >= num_frames:
        return list(range(num_frames))
    if count == 1:
        return [num_frames // 2]
    return [round(i * (num_frames - 1) / (count - 1)) for i in range(count)]


def sample_frames(frames: np.ndarray | torch.Tensor, count: int) -> np.ndarray:
    """The frames at :func:`sample_frame_indices`, (count, H, W, 3)."""
    array = as_frames(frames)
    return array[sample_frame_indices(len(array), count)]


# --------------------------------------------------------------------------------------------
# CLIP-I, CLIP-T
# --------------------------------------------------------------------------------------------


class CLIPScorer:
    """CLIP-I and CLIP-T with a full open_clip model (image and text towers).

    Images go through the model's own open_clip evaluation transform (resize the short side, centre crop, CLIP
    mean/std), so scores match other open_clip evaluations of the same checkpoint.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, name: str, scale: float = 1.0,
                 frames_per_clip: int = 0, device: str | torch.device = "cpu"):
        import open_clip
        from open_clip.transform import PreprocessCfg, image_transform_v2

        self.model = model.eval().requires_grad_(False).to(device)
        self.tokenizer = tokenizer
        self.name = name
        self.scale = scale  # 1 = raw cosine, 100 = "CLIPScore" scale
        self.frames_per_clip = frames_per_clip  # evenly sampled frames per clip; 0 = every frame
        self.device = torch.device(device)
        preprocess_cfg = PreprocessCfg(**open_clip.get_model_preprocess_cfg(model))
        self.transform = image_transform_v2(preprocess_cfg, is_train=False)

    @classmethod
    def from_config(cls, cfg: CLIPConfig, *, scale: float = 1.0, frames_per_clip: int = 0,
                    device: str | torch.device = "cpu") -> CLIPScorer:
        """Load the open_clip model from ``cfg.checkpoint`` (local file) and its tokenizer (offline for CLIP BPE)."""
        import open_clip

        model = load_open_clip(cfg)
        tokenizer = open_clip.get_tokenizer(cfg.arch)
        return cls(model, tokenizer, name=f"{cfg.arch} ({cfg.checkpoint})", scale=scale,
                   frames_per_clip=frames_per_clip, device=device)

    @torch.no_grad()
    def image_embeddings(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Unit-norm image embeddings of the sampled frames, (T', D) float32 on the CPU."""
        from PIL import Image

        array = sample_frames(frames, self.frames_per_clip)
        pixels = torch.stack([self.transform(Image.fromarray(frame)) for frame in array])  # (T', 3, S, S)
        dtype = next(self.model.parameters()).dtype
        embeds = self.model.encode_image(pixels.to(self.device, dtype))  # (T', D)
        return F.normalize(embeds.float(), dim=-1).cpu()

    @torch.no_grad()
    def text_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit-norm text embeddings, (N, D) float32 on the CPU (texts longer than the context are truncated)."""
        tokens = self.tokenizer(list(texts)).to(self.device)  # (N, context_length)
        return F.normalize(self.model.encode_text(tokens).float(), dim=-1).cpu()

    def clip_i(self, generated: np.ndarray | torch.Tensor, reference: np.ndarray | torch.Tensor,
               pairing: str = "all") -> float:
        """Mean image-image cosine (times ``scale``) between sampled generated frames and reference frames.

        ``pairing="all"``: every generated frame against every reference frame/image (character references).
        ``pairing="paired"``: frame t against frame t; both clips must have the same number of frames.
        """
        gen = self.image_embeddings(generated)  # (T', D)
        ref = self.image_embeddings(reference)  # (R', D)
        if pairing == "paired":
            if gen.shape[0] != ref.shape[0]:
                raise ValueError(f"paired CLIP-I needs equal frame counts, got {gen.shape[0]} and {ref.shape[0]}")
            cos = (gen * ref).sum(-1)  # (T',)
        elif pairing == "all":
            cos = gen @ ref.T  # (T', R')
        else:
            raise ValueError(f"pairing={pairing!r} is not one of ['all', 'paired']")
        return self.scale * cos.mean().item()

    def clip_t(self, generated: np.ndarray | torch.Tensor, text: str) -> float:
        """Mean image-text cosine (times ``scale``) between sampled generated frames and ``text``."""
        gen = self.image_embeddings(generated)  # (T', D)
        txt = self.text_embeddings([text])  # (1, D)
        return self.scale * (gen @ txt.T).mean().item()


# --------------------------------------------------------------------------------------------
# DreamSim (optional extra)
# --------------------------------------------------------------------------------------------

# Files the dreamsim package expects in its cache dir per model type (dreamsim 0.2.1); it would download them if
# absent, which we never let it try. Its DINO branch also goes through torch.hub with the cache dir as hub dir, so
# the hub checkout of facebookresearch/dino and that repo's own checkpoint must be there too.
_DINO_HUB = ("facebookresearch_dino_main", "checkpoints/dino_vitbase16_pretrain.pth")
DREAMSIM_FILES: dict[str, tuple[str, ...]] = {
    "ensemble": ("dino_vitb16_pretrain.pth", "open_clip_vitb16_pretrain.pth.tar", "clip_vitb16_pretrain.pth.tar",
                 "ensemble_lora", *_DINO_HUB),
    "dino_vitb16": ("dino_vitb16_pretrain.pth", "dino_vitb16_single_lora", *_DINO_HUB),
    "open_clip_vitb32": ("open_clip_vitb32_pretrain.pth.tar", "open_clip_vitb32_single_lora"),
    "clip_vitb32": ("clip_vitb32_pretrain.pth.tar", "clip_vitb32_single_lora"),
}


class DreamSimScorer:
    """DreamSim distance (1 - cosine of DreamSim embeddings; lower is more similar) with local weights."""

    def __init__(self, model, preprocess, *, name: str, frames_per_clip: int = 0,
                 device: str | torch.device = "cpu"):
        self.model = model
        self.preprocess = preprocess
        self.name = name
        self.frames_per_clip = frames_per_clip
        self.device = torch.device(device)

    @classmethod
    def from_weights(cls, weights_dir: str | Path, *, dreamsim_type: str = "ensemble", frames_per_clip: int = 0,
                     device: str | torch.device = "cpu") -> DreamSimScorer:
        """Load DreamSim from ``weights_dir`` (the package's cache dir); raise :class:`MetricUnavailable` if the
        package, the directory or one of its files is missing."""
        if not str(weights_dir):
            raise MetricUnavailable("DreamSim: no weights directory configured (dreamsim_path is empty)")
        try:
            from dreamsim import dreamsim
        except ImportError as exc:
            raise MetricUnavailable(
                f"DreamSim: the dreamsim package is not installed ({exc}); pip install 'animegamer[metrics]'"
            ) from None
        if dreamsim_type not in DREAMSIM_FILES:
            raise ValueError(f"dreamsim_type={dreamsim_type!r} is not one of {sorted(DREAMSIM_FILES)}")
        root = Path(weights_dir)
        missing = [name for name in DREAMSIM_FILES[dreamsim_type] if not (root / name).exists()]
        if missing:
            raise MetricUnavailable(f"DreamSim: weights not found in {root} (missing {', '.join(missing)})")
        model, preprocess = dreamsim(pretrained=True, device=str(device), cache_dir=str(root),
                                     dreamsim_type=dreamsim_type)
        return cls(model, preprocess, name=f"dreamsim-{dreamsim_type} ({root})", frames_per_clip=frames_per_clip,
                   device=device)

    @torch.no_grad()
    def embeddings(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        from PIL import Image

        array = sample_frames(frames, self.frames_per_clip)
        pixels = torch.cat([self.preprocess(Image.fromarray(frame)) for frame in array]).to(self.device)
        return F.normalize(self.model.embed(pixels).float(), dim=-1).cpu()  # (T', D)

    def distance(self, generated: np.ndarray | torch.Tensor, reference: np.ndarray | torch.Tensor,
                 pairing: str = "all") -> float:
        """Mean DreamSim distance; ``pairing`` as in :meth:`CLIPScorer.clip_i`."""
        gen, ref = self.embeddings(generated), self.embeddings(reference)
        if pairing == "paired":
            if gen.shape[0] != ref.shape[0]:
                raise ValueError(f"paired DreamSim needs equal frame counts, got {gen.shape[0]} and {ref.shape[0]}")
            cos = (gen * ref).sum(-1)
        elif pairing == "all":
            cos = gen @ ref.T
        else:
            raise ValueError(f"pairing={pairing!r} is not one of ['all', 'paired']")
        return (1.0 - cos).mean().item()


def try_dreamsim(weights_dir: str | Path, **kwargs: Any) -> tuple[DreamSimScorer | None, str]:
    """``(scorer, "")`` when DreamSim loads, else ``(None, reason)``; the reason goes into the results."""
    try:
        return DreamSimScorer.from_weights(weights_dir, **kwargs), ""
    except MetricUnavailable as exc:
        return None, str(exc)


# --------------------------------------------------------------------------------------------
# Motion level and state accuracy
# --------------------------------------------------------------------------------------------


def _check_levels(levels: Sequence[int], name: str) -> list[int]:
    allowed = VALUE_RANGES["motion_level"]
    out = []
    for value in levels:
        if isinstance(value, bool) or int(value) != value or int(value) not in allowed:
            raise ValueError(f"{name}: motion level {value!r} is not one of {list(allowed)}")
        out.append(int(value))
    return out


def motion_level_metrics(predicted: Sequence[int], target: Sequence[int]) -> dict[str, float]:
    """ACC-F (fraction of equal levels) and MAE-F (mean |predicted - target|) over paired motion levels 1..5.

    ``predicted`` are levels measured on generated clips with the same flow estimator and bin edges as the ground
    truth (see :class:`MetricSettings`); for one turn pass one-element sequences.
    """
    pred, true = _check_levels(predicted, "predicted"), _check_levels(target, "target")
    if len(pred) != len(true) or not pred:
        raise ValueError(f"need equally many, non-zero levels; got {len(pred)} predicted and {len(true)} targets")
    diffs = [abs(p - t) for p, t in zip(pred, true, strict=True)]
    return {"acc_f": sum(d == 0 for d in diffs) / len(diffs), "mae_f": sum(diffs) / len(diffs)}


def state_metrics(predicted: Sequence[StateValues], target: Sequence[StateValues]) -> dict[str, float]:
    """Accuracy of the predicted social / entertainment / stamina values against the ground truth.

    Returns ``acc_social``, ``acc_entertainment``, ``acc_stamina``, ``acc_s`` (their mean: ACC-S) and ``mae_s``
    (mean |stamina delta error|, in -1/0/+1 units: MAE-S).
    """
    if len(predicted) != len(target) or not predicted:
        raise ValueError(f"need equally many, non-zero states; got {len(predicted)} and {len(target)}")
    n = len(predicted)
    acc = {
        name: sum(getattr(p, name) == getattr(t, name) for p, t in zip(predicted, target, strict=True)) / n
        for name in ("social", "entertainment", "stamina")
    }
    return {
        **{f"acc_{name}": value for name, value in acc.items()},
        "acc_s": sum(acc.values()) / len(acc),
        "mae_s": sum(abs(p.stamina - t.stamina) for p, t in zip(predicted, target, strict=True)) / n,
    }


# --------------------------------------------------------------------------------------------
# PSNR, SSIM
# --------------------------------------------------------------------------------------------


def _pixel_pair(generated, reference) -> tuple[torch.Tensor, torch.Tensor]:
    """Both clips as float64 (T, 3, H, W) in 0..255, after checking they are uint8 frames of one shape."""
    a, b = as_frames(generated), as_frames(reference)
    if a.shape != b.shape:
        raise ValueError(f"pixel metrics need clips of equal shape, got {a.shape} and {b.shape}")
    return torch.from_numpy(a).double().permute(0, 3, 1, 2), torch.from_numpy(b).double().permute(0, 3, 1, 2)


# torchmetrics is imported where PSNR / SSIM are computed: its package import pulls in transformers, torchvision,
# scipy and torch._dynamo (about 10 s on 2 CPU cores), which the records, tables and intervals of this module
# never need.


def psnr(generated: np.ndarray | torch.Tensor, reference: np.ndarray | torch.Tensor) -> float:
    """PSNR in dB from the mean squared error over the whole clip (all frames, pixels, channels), range 255.

    Identical clips give ``math.inf`` (no cap); a clip-level MSE keeps one identical frame from making the mean
    infinite, as a per-frame average would. Computed by torchmetrics' ``peak_signal_noise_ratio`` with
    ``data_range=255`` and no ``dim`` (one MSE over everything); it keeps ln(255) and 10 / ln(10) in float32, so
    values agree with the exact float64 formula to about 1e-6 dB.
    """
    from torchmetrics.functional.image import peak_signal_noise_ratio

    a, b = _pixel_pair(generated, reference)
    return peak_signal_noise_ratio(a, b, data_range=255.0).item()


def _gaussian_filter_valid(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``x`` (..., H, W) filtered by the separable window ``weights`` (k,) along H and W at the valid positions:
    (..., H - k + 1, W - k + 1), as shifted weighted sums (float64 stays exact to rounding)."""
    k = len(weights)
    rows = sum(weights[i] * x[..., i : x.shape[-2] - k + 1 + i, :] for i in range(k))
    return sum(weights[j] * rows[..., j : x.shape[-1] - k + 1 + j] for j in range(k))


def ssim(generated: np.ndarray | torch.Tensor, reference: np.ndarray | torch.Tensor, window: int = 11,
         sigma: float = 1.5) -> float:
    """Mean SSIM (Wang et al. 2004): Gaussian window 11 / sigma 1.5, K1 = 0.01, K2 = 0.03, range 255.

    Computed per RGB channel over "valid" window positions (no padding), averaged over positions, channels and
    frames, in float64. Identical clips give 1.0. ``window`` must be the size torchmetrics gives a Gaussian
    window of ``sigma`` (``2 * int(3.5 * sigma + 0.5) + 1``: 11 for 1.5).

    The map is torchmetrics' ``structural_similarity_index_measure`` map inside its border (equal to 1e-12,
    tested), where the library's reflect padding does not reach; its own mean is not used, since it also counts
    the outer (window - 1) / 2 pixels on each side (24 % of a 64 x 96 frame) with mirrored neighbourhoods and
    differs from the valid-position mean (Wang et al.'s reference code, scikit-image) by up to 0.06. The Gaussian
    window is applied as two 1-D passes here: torch's float64 2-D convolution, which the library runs, took 0.5 s
    per 9-frame clip on a 2-core CPU (80 % of an evaluation's time), the two passes a few milliseconds.
    """
    gaussian_size = 2 * int(3.5 * sigma + 0.5) + 1
    if window != gaussian_size:
        raise ValueError(f"window {window} does not match sigma {sigma}: a Gaussian window of sigma {sigma} "
                         f"is {gaussian_size} pixels wide")
    a, b = _pixel_pair(generated, reference)  # (T, 3, H, W) float64
    if min(a.shape[2:]) < window:
        raise ValueError(f"frames of {a.shape[2]}x{a.shape[3]} are smaller than the SSIM window {window}")
    offsets = torch.arange(window, dtype=torch.float64) - (window - 1) / 2
    weights = torch.exp(-((offsets / sigma) ** 2) / 2)
    weights = weights / weights.sum()  # (k,), torchmetrics' window is its outer product with itself
    mu_a, mu_b = _gaussian_filter_valid(a, weights), _gaussian_filter_valid(b, weights)  # (T, 3, H', W')
    var_a = _gaussian_filter_valid(a * a, weights) - mu_a**2
    var_b = _gaussian_filter_valid(b * b, weights) - mu_b**2
    cov = _gaussian_filter_valid(a * b, weights) - mu_a * mu_b
    c1, c2 = (0.01 * 255.0) ** 2, (0.03 * 255.0) ** 2
    ssim_map = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return ssim_map.mean().item()


# --------------------------------------------------------------------------------------------
# Records and aggregation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSettings:
    """How the numbers were produced; stored with every result (DESIGN §3)."""

    clip_model: str = ""  # open_clip arch and checkpoint of CLIP-I / CLIP-T ("" if not computed)
    clip_scale: float = 1.0  # 1 = raw cosine in [-1, 1]; 100 = 100x cosine ("CLIPScore")
    clip_frames: int = 0  # frames sampled evenly per clip for CLIP / DreamSim; 0 = every frame
    reference: str = ""  # what CLIP-I / DreamSim compare with, e.g. "character reference images (pairing=all)"
    dreamsim: str = ""  # the DreamSim model used, or "missing: <reason>"
    flow: dict[str, Any] = field(default_factory=dict)  # flow estimator, threshold and level bin edges for ACC-F

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricSettings:
        return cls(**data)


@dataclass
class MetricRecord:
    """The metrics of one system on one turn of one game (``turn = -1``: game-level, e.g. the LLM judge)."""

    system: str
    game_id: str
    turn: int
    values: dict[str, float | None]  # metric name (see METRICS) -> value; None = not computed, see `missing`
    missing: dict[str, str] = field(default_factory=dict)  # metric name -> why it is missing
    settings: MetricSettings = field(default_factory=MetricSettings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricRecord:
        return cls(
            system=data["system"], game_id=data["game_id"], turn=int(data["turn"]), values=dict(data["values"]),
            missing=dict(data.get("missing", {})), settings=MetricSettings.from_dict(data.get("settings", {})),
        )


@dataclass
class MetricSummary:
    """Means of one system's records: ``means[m]`` over the records that have ``m``, with their count."""

    system: str
    means: dict[str, float | None]
    counts: dict[str, int]
    missing: dict[str, str]  # metrics with no value at all, and why
    settings: MetricSettings

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _one_system(records: Sequence[MetricRecord]) -> tuple[str, MetricSettings]:
    if not records:
        raise ValueError("no metric records to summarise")
    systems = {r.system for r in records}
    if len(systems) != 1:
        raise ValueError(f"records of several systems {sorted(systems)}; summarise one system at a time")
    settings = records[0].settings
    for r in records:
        if r.settings != settings:
            raise ValueError(
                f"records of {r.system} were produced with different settings ({r.game_id} turn {r.turn}: "
                f"{r.settings} vs {settings}); scores from different CLIP models, scales or flow settings "
                "must not be averaged"
            )
    return records[0].system, settings


def summarize(records: Sequence[MetricRecord]) -> MetricSummary:
    """Mean of every metric over the records of one system (records lacking a metric are skipped for it).

    ACC-F / MAE-F / ACC-S / MAE-S per turn are 0/1 indicators and absolute errors, so their mean over turns is the
    dataset accuracy / error. Means with an infinite PSNR are infinite.
    """
    system, settings = _one_system(records)
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    reasons: dict[str, str] = {}
    names: list[str] = []
    for r in records:
        for name in list(r.values) + list(r.missing):
            if name not in names:
                names.append(name)
        for name, value in r.values.items():
            if value is not None:
                sums[name] += value
                counts[name] += 1
        for name, why in r.missing.items():
            reasons.setdefault(name, why)
    means = {name: (sums[name] / counts[name] if counts[name] else None) for name in names}
    missing = {name: reasons.get(name, "no value in any record") for name in names if not counts[name]}
    return MetricSummary(system, means, {name: counts[name] for name in names}, missing, settings)


def per_turn(records: Sequence[MetricRecord], metric: str) -> dict[int, float]:
    """Mean of ``metric`` per turn index over one system's games (for "metric per turn" plots), sorted by turn."""
    _one_system(records)
    by_turn: dict[int, list[float]] = defaultdict(list)
    for r in records:
        value = r.values.get(metric)
        if value is not None and r.turn >= 0:
            by_turn[r.turn].append(value)
    return {turn: sum(v) / len(v) for turn, v in sorted(by_turn.items())}
