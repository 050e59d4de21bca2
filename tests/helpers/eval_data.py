"""Shared by the evaluation and ablation tests: a tiny SpriteWorld with held-out games, and tiny-model overrides."""

from __future__ import annotations

from pathlib import Path

from animegamer.config import CLIPConfig, SpriteWorldConfig
from animegamer.spriteworld import write_dataset


def make_spriteworld(root: Path) -> Path:
    """4 films x 3 shots of 48x64, 9 frames; 2 films held out as 3-turn games in ``root/games``. Returns root."""
    cfg = SpriteWorldConfig(output_dir=str(root), num_films=4, shots_per_film=3, height=48, width=64, num_frames=9,
                            test_fraction=0.5, workers=1)
    write_dataset(cfg, progress=False)
    return root


def clip_overrides(prefix: str, clip: CLIPConfig) -> list[str]:
    return [f"{prefix}.arch={clip.arch}", f"{prefix}.checkpoint={clip.checkpoint}",
            f"{prefix}.model_config={clip.model_config}", f"{prefix}.image_size={clip.image_size}"]


def eval_overrides(data: Path, clip: CLIPConfig, cogvideox: str, mistral: str) -> list[str]:
    """configs/tiny/eval.yaml on the test's tiny models and SpriteWorld data, untrained parts, 2 sampling steps."""
    return [
        f"benchmark={data / 'games'}", f"motion_manifest={data / 'clips.jsonl'}",
        *clip_overrides("metrics_clip", clip), *clip_overrides("clip", clip),
        f"t5.path={cogvideox}", f"inference.decoder.pretrained={cogvideox}",
        f"inference.mllm.pretrained={mistral}", "inference.mllm_checkpoint=", "inference.decoder_checkpoint=",
        "stage_a_checkpoint=", "inference.sampling.steps=2",
    ]
