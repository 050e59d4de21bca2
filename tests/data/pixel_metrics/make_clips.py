"""Write clips.npz: real SpriteWorld shots and the shipped VAE's reconstruction of each, for tests/test_metrics.py.

    PYTHONPATH=$PWD python tests/data/pixel_metrics/make_clips.py

``real``: three shots drawn by the world (64 x 96, 9 frames, as the SpriteWorld evaluation compares them);
``vae``: each shot encoded and decoded by ``checkpoints/spriteworld/CogVideoX/vae`` (generated-looking frames with
the blur and ringing of a learned decoder). The frames are stored, not redrawn in the test, so a later change of
the world's drawing cannot move the frozen metric values beside them (``values.json``).
"""

from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLCogVideoX

from animegamer.spriteworld import render_shot
from animegamer.spriteworld.world import ShotSpec

OUT = Path(__file__).parent
SHOTS = (
    (ShotSpec("Qiqi", "walk", "park", "morning", "happily"), 3),
    (ShotSpec("Kai", "talk", "kitchen", "evening", "calmly", friend="Luna"), 11),
    (ShotSpec("Momo", "jump", "beach", "night", "energetically"), 7),
)


def main() -> None:
    real = np.stack([render_shot(spec, seed, height=64, width=96, num_frames=9) for spec, seed in SHOTS])
    vae = AutoencoderKLCogVideoX.from_pretrained("checkpoints/spriteworld/CogVideoX", subfolder="vae").eval()
    with torch.no_grad():
        x = torch.from_numpy(real).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0  # (B, 3, T, H, W) in [-1, 1]
        video = vae.decode(vae.encode(x).latent_dist.mode()).sample
    decoded = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1).numpy()
    np.savez_compressed(OUT / "clips.npz", real=real, vae=decoded)
    print(f"{OUT / 'clips.npz'}: real {real.shape}, vae {decoded.shape}")


if __name__ == "__main__":
    main()
