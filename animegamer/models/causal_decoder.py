"""CausalLatentDecoder: a small streaming decoder from CogVideoX VAE latents to frames (stage e).

    latents (B, F, C, h, w)  scaled VAE latents, the transformer's layout (F = 1 + k latent frames)
       │  conv_in 3x3 (C -> channels[0])                                   per frame, 2D
       ▼
    level i = 0 .. L-1 (L = log2(spatial factor); CogVideoX: 3 levels, channels 256 / 128 / 64):
       blocks_per_level x MemoryBlock      x_t + f([x_t, x_{t-1}])        per frame, with the previous frame's input
       upsample: nearest 2x + conv 3x3 (channels[i] -> channels[i+1])      (B, T, c, H, W) -> (B, T, c', 2H, 2W)
       temporal growth on the first log2(temporal factor) levels:        (B, T, c, H, W) -> (B, 2T - 1 | 2T, c, H, W)
           conv 1x1 (c -> 2c), split into 2 frames; the clip's very first frame keeps only its second
       ▼
    ReLU, conv_out 3x3 (channels[-1] -> 3)                                 frames (B, T, 3, H, W) in about [-1, 1]
    T = 1 + r * k: the first latent frame gives 1 frame, every later one r (CogVideoX: r = 4, 5 latents -> 17 frames)

Why this shape. In a 4-step turn the CogVideoX VAE is most of the time (docs/fast_turns.md) and its 3D
causal convolutions over 123 M parameters make the first frames wait for the first two latent frames' batch. The
open real-time video models pair few-step samplers with a small latent decoder instead (MotionStream puts about 70 %
of its latency in the VAE until it swaps one in; Turbo-VAED reports 8x CogVideoX's decode speed at -0.65 dB PSNR).
TAEHV shows that per-frame 2D convolutions plus a memory of the previous frame and 2x temporal upsampling decode
CogVideoX latents with about 10 M parameters. We build that family, our own way:

- **2D convolutions per frame** carry almost all the work: spatially a VAE decoder is an upsampling CNN, and a 2D
  conv costs a third of a 3x3x3 one.
- **Memory of the previous frame**: each block reads its own input of the previous frame (not its output), so the
  whole clip's frames go through a block in one batched call (training, whole-clip decode), and a stream only
  carries each block's last input from one latent frame to the next: the result is the same either way, and a
  frame never waits for a later latent. That is what makes the first latent frame's frames come out at once.
- **Temporal growth by 2 on the coarse levels**, where it is cheap, reproduces CogVideoX's 1 + 4k layout; a VAE
  without temporal compression (``temporal_factor=1``, SpriteWorld's) has none.
- The defaults (channels 256 / 128 / 64, 3 blocks per level) give 9.9 M parameters for CogVideoX's 16-channel
  latents, against 123 M in the CogVideoX decoder.

Why this loss. Stage (e) regresses the real frames (MSE in [-1, 1]) from the frozen VAE's latents of the same clip,
on random spatial crops of whole clips (animegamer.training.losses / scripts/train_stage_e.py): the real frames are
the target the big decoder itself was trained for, so the small one is not capped at the big one's quality, and
crops keep a full-size step cheap while the 2D convolutions see the same local statistics as on whole frames. A
crop keeps every latent frame, since the first latent frame of a CogVideoX clip is encoded differently from the
rest. (TAEHV adds an adversarial term for sharpness; a GAN is a second model and a min-max game, left out here.)

Saved as a directory: ``config.json`` (the constructor's arguments) + ``model.safetensors``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from animegamer.io import atomic_write_json, read_format_json, read_json_bounded
from animegamer.models.weights import load_state_dict_file, save_state_dict_file
from animegamer.sampling.streaming import to_uint8_frames

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "animegamer-causal-decoder-1"


@dataclass
class DecodeState:
    """What a stream carries from one latent frame to the next: every memory block's last input frame and whether
    the clip's first frame has been decoded."""

    memories: list[torch.Tensor | None] = field(default_factory=list)
    started: bool = False


class MemoryBlock(nn.Module):
    """x_t + f(concat(x_t, x_{t-1})) per frame; x_{-1} is zero (or the previous chunk's last frame)."""

    def __init__(self, channels: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(2 * channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
        )

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, c, H, W), memory (B, c, H, W) or None -> (out (B, T, c, H, W), the new memory x[:, -1])."""
        b, t = x.shape[:2]
        first = torch.zeros_like(x[:, :1]) if memory is None else memory[:, None]
        previous = torch.cat([first, x[:, :-1]], dim=1)  # (B, T, c, H, W): each frame's predecessor
        both = torch.cat([x, previous], dim=2).flatten(0, 1)  # (B*T, 2c, H, W)
        out = x + self.net(both).unflatten(0, (b, t))
        return torch.relu(out), x[:, -1]


class TemporalGrowth(nn.Module):
    """Every frame becomes ``factor`` frames (conv 1x1 to factor x channels, split); the clip's first frame keeps
    only its last one, as CogVideoX's first latent frame stands for a single frame."""

    def __init__(self, channels: int, factor: int):
        super().__init__()
        self.factor = factor
        self.conv = nn.Conv2d(channels, channels * factor, 1)

    def forward(self, x: torch.Tensor, first_in_clip: bool) -> torch.Tensor:
        b, t, c, h, w = x.shape
        grown = self.conv(x.flatten(0, 1)).view(b, t, self.factor, c, h, w)  # (B, T, r, c, H, W)
        grown = grown.flatten(1, 2)  # (B, T*r, c, H, W), frame-major
        return grown[:, self.factor - 1 :] if first_in_clip else grown


class CausalLatentDecoder(nn.Module):
    """Scaled CogVideoX latents (B, F, C, h, w) -> frames (B, 1 + r(F-1), 3, s*h, s*w), one latent frame at a time
    if wanted (:meth:`stream`). ``spatial_factor`` s and ``temporal_factor`` r are the VAE's compression."""

    def __init__(
        self,
        latent_channels: int = 16,
        spatial_factor: int = 8,
        temporal_factor: int = 4,
        channels: tuple[int, ...] = (256, 128, 64),
        blocks_per_level: int = 3,
    ):
        super().__init__()
        levels = round(math.log2(spatial_factor))
        growths = round(math.log2(temporal_factor)) if temporal_factor >= 1 else -1
        if spatial_factor < 2 or 2**levels != spatial_factor:
            raise ValueError(f"spatial_factor={spatial_factor}: a power of 2, at least 2")
        if growths < 0 or 2**growths != temporal_factor or growths > levels:
            raise ValueError(f"temporal_factor={temporal_factor}: a power of 2 of at most spatial_factor")
        if len(channels) != levels or blocks_per_level < 1 or min(channels) < 1:
            raise ValueError(f"channels={list(channels)}: one width per 2x upsampling level ({levels} levels)")
        self.config = {
            "latent_channels": latent_channels, "spatial_factor": spatial_factor, "temporal_factor": temporal_factor,
            "channels": list(channels), "blocks_per_level": blocks_per_level,
        }
        self.spatial_factor, self.temporal_factor = spatial_factor, temporal_factor
        self.conv_in = nn.Conv2d(latent_channels, channels[0], 3, padding=1)
        self.blocks = nn.ModuleList()
        self.upsamples = nn.ModuleList()
        self.growths = nn.ModuleList()
        for i, width in enumerate(channels):
            self.blocks.append(nn.ModuleList(MemoryBlock(width) for _ in range(blocks_per_level)))
            out = channels[min(i + 1, levels - 1)]
            self.upsamples.append(nn.Conv2d(width, out, 3, padding=1))
            self.growths.append(TemporalGrowth(width, 2) if i < growths else nn.Identity())
        self.conv_out = nn.Conv2d(channels[-1], 3, 3, padding=1)

    @property
    def memory_blocks(self) -> list[MemoryBlock]:
        """Every memory block in decoding order (the repeated blocks a regional compile targets)."""
        return [block for level in self.blocks for block in level]

    def compile_blocks(self, **kwargs) -> None:
        """Regional compile: ``torch.compile`` each memory block in place (the repeated work; the few convs between
        levels stay eager), so one compiled graph per block shape is reused across frames and chunks. ``kwargs``
        go to torch.compile (e.g. ``backend="aot_eager"`` on a CPU, ``mode="max-autotune"`` on a GPU)."""
        for block in self.memory_blocks:
            block.compile(**kwargs)

    def num_frames(self, num_latent_frames: int) -> int:
        """Frames decoded from ``num_latent_frames`` latent frames: 1 + r * (F - 1)."""
        return 1 + self.temporal_factor * (num_latent_frames - 1)

    def forward(self, latents: torch.Tensor, state: DecodeState | None = None) -> tuple[torch.Tensor, DecodeState]:
        """Latent frames (B, F, C, h, w) -> (frames (B, T, 3, H, W), the state to decode the next latent frames
        with). ``state`` None starts a clip; passing the returned state on continues it exactly."""
        if latents.ndim != 5:
            raise ValueError(f"expected latents (B, F, C, h, w), got {tuple(latents.shape)}")
        first_in_clip = state is None or not state.started
        memories: list[torch.Tensor | None] = [None] * len(self.memory_blocks)
        if state is not None and state.memories:
            memories = state.memories
        new_memories: list[torch.Tensor] = []
        b, f = latents.shape[:2]
        x = self.conv_in(latents.flatten(0, 1)).unflatten(0, (b, f))  # (B, F, c0, h, w)
        for level, upsample, growth in zip(self.blocks, self.upsamples, self.growths, strict=True):
            for block in level:
                x, memory = block(x, memories[len(new_memories)])
                new_memories.append(memory)
            if isinstance(growth, TemporalGrowth):
                x = growth(x, first_in_clip)  # (B, T', c, H, W)
            t = x.shape[1]
            x = F.interpolate(x.flatten(0, 1), scale_factor=2.0, mode="nearest")  # (B*T, c, 2H, 2W)
            x = torch.relu(upsample(x)).unflatten(0, (b, t))
        frames = self.conv_out(x.flatten(0, 1)).unflatten(0, (b, x.shape[1]))  # (B, T, 3, H, W)
        return frames, DecodeState(new_memories, started=True)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """A whole clip: latents (B, F, C, h, w) -> frames (B, T, 3, H, W)."""
        return self(latents)[0]

    def stream(self, latents: torch.Tensor, chunk: int = 1) -> Iterator[torch.Tensor]:
        """Frames (B, t, 3, H, W) of every ``chunk`` latent frames in turn, each as soon as those latent frames are
        decoded; together they are :meth:`decode`'s frames."""
        state = None
        for start in range(0, latents.shape[1], chunk):
            frames, state = self(latents[:, start : start + chunk], state)
            yield frames

    @torch.no_grad()
    def decode_chunks(self, latents: torch.Tensor, chunk: int = 1) -> Iterator[torch.Tensor]:
        """Scaled latents (B, F, C, h, w) -> uint8 frames (B, t, H, W, 3) on the CPU, latent frame by latent frame
        (the small decoder's counterpart of animegamer.sampling.streaming.decode_chunks)."""
        param = next(self.parameters())
        latents = latents.to(device=param.device, dtype=param.dtype)
        for frames in self.stream(latents, chunk):
            yield to_uint8_frames(frames.transpose(1, 2))  # (B, 3, t, H, W) -> (B, t, H, W, 3)

    def num_chunks(self, num_latent_frames: int, chunk: int = 1) -> int:
        return math.ceil(num_latent_frames / chunk)

    def check_vae(self, latent_channels: int, spatial_factor: int, temporal_factor: int, where: str = "") -> None:
        """ValueError unless this decoder was made for latents of that VAE layout."""
        mine = (self.config["latent_channels"], self.spatial_factor, self.temporal_factor)
        if mine != (latent_channels, spatial_factor, temporal_factor):
            raise ValueError(
                f"{where or 'small decoder'}: made for latents of (channels, spatial, temporal) = {mine}, the VAE "
                f"gives {(latent_channels, spatial_factor, temporal_factor)}"
            )

    def save_pretrained(self, out_dir: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
        """``out_dir/config.json`` + ``out_dir/model.safetensors`` (each written atomically). ``state_dict``: the
        weights to write where this module holds only shards (a training run gathers them first)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        save_state_dict_file(self.state_dict() if state_dict is None else state_dict, out_dir / WEIGHTS_FILE)
        atomic_write_json(out_dir / CONFIG_FILE, {"format": FORMAT, **self.config})
        return out_dir

    @classmethod
    def from_pretrained(cls, in_dir: str | Path, device: str | torch.device = "cpu") -> CausalLatentDecoder:
        """The decoder saved in ``in_dir``; a missing or malformed file raises one-line FileNotFoundError or
        ValueError naming it."""
        in_dir = Path(in_dir)
        config_file = in_dir / CONFIG_FILE
        if not config_file.is_file():
            raise FileNotFoundError(f"small decoder not found: {config_file} is missing")
        raw = read_format_json(config_file, FORMAT, "a small decoder config")
        kwargs = {k: raw.get(k) for k in ("latent_channels", "spatial_factor", "temporal_factor", "channels",
                                          "blocks_per_level")}
        if not all(isinstance(v, int) and not isinstance(v, bool) for k, v in kwargs.items() if k != "channels") or \
                not isinstance(kwargs["channels"], list) or not all(isinstance(c, int) for c in kwargs["channels"]):
            raise ValueError(f"{config_file}: malformed small decoder config")
        model = cls(**{**kwargs, "channels": tuple(kwargs["channels"])})
        state = load_state_dict_file(in_dir / WEIGHTS_FILE)
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise ValueError(f"{in_dir / WEIGHTS_FILE}: does not fit {config_file} ({str(exc).splitlines()[0]})") \
                from None
        return model.to(device).eval()


def vae_layout(vae_config: dict, where: str = "vae config") -> tuple[int, int, int]:
    """(latent channels, spatial factor, temporal factor) of a CogVideoX VAE config (``vae/config.json``)."""
    try:
        return (int(vae_config["latent_channels"]), 2 ** (len(vae_config["block_out_channels"]) - 1),
                int(vae_config["temporal_compression_ratio"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a CogVideoX VAE config ({exc})") from None


def read_vae_layout(pretrained: str | Path) -> tuple[int, int, int]:
    """:func:`vae_layout` of ``pretrained/vae/config.json`` (no VAE is loaded)."""
    path = Path(pretrained) / "vae" / "config.json"
    try:
        raw = read_json_bounded(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"VAE config not found: {path}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return vae_layout(raw, str(path))
