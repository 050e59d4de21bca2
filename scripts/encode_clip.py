"""Encode one clip + motion text into its action-aware shot representation s_a (N x hidden), printing shapes.

    python scripts/encode_clip.py --config configs/tiny/stage_a.yaml --video clip.mp4 --text "Character: Qiqi; ..."

Without --video a synthetic clip is drawn. The encoder starts from --encoder-weights (safetensors) if given,
else from its seeded initialisation. Writes ``output_dir/shot_embeds.safetensors``.
"""

from __future__ import annotations

import numpy as np
import torch

from animegamer.cli import parse_config
from animegamer.config import StageAConfig
from animegamer.data.video import read_video, write_mp4
from animegamer.models.clip_image import CLIPImageFeatures
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.t5_text import T5TextFeatures
from animegamer.models.weights import load_state_dict_file, save_state_dict_file


def synthetic_clip(num_frames: int, height: int, width: int) -> np.ndarray:
    """A yellow square crossing a gradient: (T, H, W, 3) uint8."""
    frames = np.zeros((num_frames, height, width, 3), np.uint8)
    frames[..., 2] = np.linspace(40, 160, width, dtype=np.uint8)[None, None, :]
    size = max(4, height // 5)
    for t in range(num_frames):
        x = int((width - size) * t / max(1, num_frames - 1))
        frames[t, height // 2 - size // 2 : height // 2 + size // 2, x : x + size] = (250, 210, 40)
    return frames


def main() -> None:
    def flags(parser):
        parser.add_argument("--video", help="clip to encode (default: a synthetic clip)")
        parser.add_argument("--text", default="Character: Qiqi; Motion: quickly run; Background: park.",
                            help="the motion description encoded with the clip")
        parser.add_argument("--encoder-weights", help="trained encoder safetensors")

    cfg, args = parse_config(StageAConfig, __doc__, extra=flags)
    torch.manual_seed(cfg.seed)
    from pathlib import Path

    out = Path(cfg.output_dir)
    if args.video:
        frames, _ = read_video(args.video)
    else:
        frames = synthetic_clip(cfg.data.num_frames, cfg.data.height, cfg.data.width)
        args.video = str(write_mp4(out / "synthetic_clip.mp4", frames, fps=cfg.data.fps))
    print(f"clip          {args.video}: {frames.shape[0]} frames of {frames.shape[1]}x{frames.shape[2]}")

    clip = CLIPImageFeatures.from_config(cfg.clip)
    t5 = T5TextFeatures.from_config(cfg.t5)
    encoder = ActionAwareEncoder.from_config(cfg.encoder).eval()
    if args.encoder_weights:
        encoder.load_state_dict(load_state_dict_file(args.encoder_weights))

    first = torch.from_numpy(frames[:1]).permute(0, 3, 1, 2)  # (1, 3, H, W)
    with torch.no_grad():
        clip_tokens = clip(first)
        text_tokens = t5([args.text])
        shot = encoder(clip_tokens, text_tokens)
    print(f"CLIP tokens   {tuple(clip_tokens.shape)}  ({cfg.clip.arch}, block {cfg.clip.layer}, CLS dropped)")
    print(f"T5 tokens     {tuple(text_tokens.shape)}")
    print(f"s_a           {tuple(shot.shape)}  (fusion={cfg.encoder.fusion}, projector={cfg.encoder.projector})")
    path = out / "shot_embeds.safetensors"
    save_state_dict_file({"shot_embeds": shot[0]}, path, metadata={"text": args.text, "video": args.video})
    print(f"wrote         {path}")


if __name__ == "__main__":
    main()
