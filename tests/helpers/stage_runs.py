"""The tiny inputs of the training stages' real runs, shared by the stage tests (tests/test_stage_{a,b,c,d}.py) and
the engine tests (tests/test_engines.py, every stage under every engine): each stage's tiny config, the data it
reads and the overrides that point it there. The fixtures that build them once per test module are in
tests/conftest.py (``stage_a_data``, ``stage_c_runs``, ``stage_d_run``)."""

from __future__ import annotations

from pathlib import Path

import torch

from animegamer.config import CLIPConfig, MLLMConfig, load_config
from animegamer.data.features import precompute_features
from animegamer.data.manifest import ClipRecord, read_manifest, write_manifest
from animegamer.data.tensor_store import TensorStore
from animegamer.data.video import write_mp4
from animegamer.models.mllm import AnimeGamerMLLM
from tests.helpers.clips import make_clip_frames
from tests.helpers.stage_b_data import clip_id, write_stage_b_data
from tests.helpers.stage_scripts import ROOT, tiny_decoder_config, write_decoder_run

STAGE_A_CONFIG = ROOT / "configs" / "tiny" / "stage_a.yaml"
STAGE_B_CONFIG = ROOT / "configs" / "tiny" / "stage_b.yaml"
STAGE_C_CONFIG = ROOT / "configs" / "tiny" / "stage_c.yaml"
STAGE_D_CONFIG = ROOT / "configs" / "tiny" / "stage_d.yaml"

SHOT_DIM = 32  # the tiny configs' shot_dim
STAGE_B_SLOTS = 8  # stage (b)'s MLLM slots, reduced from 226 for speed
DECODER_SLOTS = 226  # the tiny CogVideoX's condition tokens: the shots stages (c), (d) read

STAGE_A_TAGS = (
    "<S>{who}</S><MD>{what}</MD><EV>park</EV><ML>{level}</ML><MA>quickly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>"
)
STAGE_C_LATENT_SHAPE = (4, 2, 4, 6)  # (C, F, h, w): 2 latent frames of 4x6, the smallest the tiny decoder takes
STAGE_C_NO_FEATURES, STAGE_C_NO_TARGET = clip_id(1, 3), clip_id(0, 2)
STAGE_D_UNCAPTIONED = clip_id(0, 3)


def write_stage_a_data(root: Path, clip: CLIPConfig, cogvideox_dir: str | Path) -> dict:
    """Four captioned clips, one corrupt, one missing, one uncaptioned under ``root``; features precomputed once.

    Returns ``root``, the stage (a) overrides that train on them, the config they load to and precompute's summary.
    """
    records = []
    for i, (speed, level, who, what) in enumerate(
        [(1, 1, "Qiqi", "sit"), (3, 2, "Sam", "walk"), (5, 4, "Mia", "run"), (7, 5, "Ken", "jump")]
    ):
        # 8 frames at 8 fps: one short of the 9 the VAE wants, so the last frame is repeated
        write_mp4(root / f"clips/c{i}.mp4", make_clip_frames(8, 48, 64, speed=speed, seed=i), fps=8)
        records.append(
            ClipRecord(
                f"film0_{i:05d}",
                f"clips/c{i}.mp4",
                "film0",
                i,
                2.0 * i,
                2.0 * i + 2,
                tags=STAGE_A_TAGS.format(who=who, what=what, level=level),
                motion_level=level,
            )
        )
    (root / "clips/broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video")
    tags = STAGE_A_TAGS.format(who="Luna", what="fly", level=3)
    records.append(ClipRecord("film1_00000", "clips/broken.mp4", "film1", 0, 0.0, 2.0, tags=tags))
    records.append(ClipRecord("film1_00001", "clips/gone.mp4", "film1", 1, 2.0, 4.0, tags=tags))
    write_mp4(root / "clips/untagged.mp4", make_clip_frames(9, 48, 64), fps=8)
    records.append(ClipRecord("film1_00002", "clips/untagged.mp4", "film1", 2, 4.0, 6.0))
    write_manifest(root / "clips.jsonl", records)
    overrides = [
        f"clip.checkpoint={clip.checkpoint}",
        f"clip.model_config={clip.model_config}",
        f"t5.path={cogvideox_dir}",
        f"decoder.pretrained={cogvideox_dir}",
        f"data.manifest={root / 'clips.jsonl'}",
        f"data.features_dir={root / 'features'}",
        "data.num_workers=0",
        "data.height=48",  # smaller and shorter than SpriteWorld's 64x96x17: faster tests
        "data.width=64",
        "data.num_frames=9",
        "train.log_every=1",
        "train.lr_warmup_steps=0",
    ]
    cfg = load_config(STAGE_A_CONFIG, overrides)
    summary = precompute_features(cfg, progress=False)
    return {"root": root, "overrides": overrides, "cfg": cfg, "summary": summary}


def stage_b_overrides(tmp_path: Path, tiny_mistral_dir: str | Path, output_dir: str | Path, **extra) -> list[str]:
    """The overrides of a tiny stage (b) run into ``output_dir``: 3 films of 5 clips written under
    ``tmp_path/data`` on first use (the last clip of film 2 without a shot target); ``extra`` adds or replaces
    ``key=value`` pairs."""
    data = tmp_path / "data"
    if not (data / "clips.jsonl").is_file():
        write_stage_b_data(data, films=3, clips_per_film=5, num_slots=STAGE_B_SLOTS, shot_dim=SHOT_DIM,
                           missing=(clip_id(2, 4),))
    values = {
        "output_dir": str(output_dir),
        "mllm.pretrained": str(tiny_mistral_dir),
        "mllm.num_slots": STAGE_B_SLOTS,
        "data.manifest": str(data / "clips.jsonl"),
        "data.split": "all",
        "shot_targets": str(data / "shot_targets"),
        "train.lr_scheduler": "constant",
        "train.lr": 3e-3,
        "train.checkpoint_every": 2,
        **extra,
    }
    return [f"{k}={v}" for k, v in values.items()]


def write_stage_c_runs(root: Path, cogvideox_dir: str | Path, mistral_dir: str | Path) -> dict:
    """Two films of 4 captioned clips with latents and shot targets, a stage (a) and a stage (b) checkpoint.

    One clip has no features (``STAGE_C_NO_FEATURES``) and one no shot target (``STAGE_C_NO_TARGET``), so its own
    window and the windows it is history of go. The checkpoints hold non-trivial trained parts (LoRA B != 0), so
    starting from them is observable. Returns ``root``, the stage (c) overrides and the two checkpoints' runs.
    """
    write_stage_b_data(root, films=2, clips_per_film=4, num_slots=DECODER_SLOTS, shot_dim=SHOT_DIM,
                       missing=(STAGE_C_NO_TARGET,))
    g = torch.Generator().manual_seed(0)
    manifest = read_manifest(root / "clips.jsonl")
    TensorStore(root / "features").write_shard(
        {r.clip_id: {"latents": torch.randn(STAGE_C_LATENT_SHAPE, generator=g)} for r in manifest.records
         if r.clip_id != STAGE_C_NO_FEATURES}
    )

    torch.manual_seed(0)
    stage_a = root / "stage_a"
    write_decoder_run(tiny_decoder_config(cogvideox_dir), stage_a, 7, g)

    mllm_cfg = MLLMConfig(pretrained=str(mistral_dir), shot_dim=SHOT_DIM, lora_rank=4, lora_alpha=4,
                          gradient_checkpointing=False, dtype="fp32")
    mllm = AnimeGamerMLLM.from_config(mllm_cfg)
    with torch.no_grad():
        for name, p in mllm.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    stage_b = root / "stage_b"
    mllm.save_trained(stage_b / "checkpoints" / "step_0000005")
    (stage_b / "checkpoints" / "latest").write_text("step_0000005\n")

    overrides = [
        f"decoder.pretrained={cogvideox_dir}",
        f"mllm.pretrained={mistral_dir}",
        f"data.manifest={root / 'clips.jsonl'}",
        f"data.features_dir={root / 'features'}",
        "data.split=all",
        f"stage_a_checkpoint={stage_a / 'checkpoints' / 'latest'}",
        f"stage_b_checkpoint={stage_b}",
        f"shot_targets={root / 'shot_targets'}",
        "train.log_every=1",
        "train.report_to=csv",
        "train.lr_warmup_steps=0",
    ]
    return {"root": root, "overrides": overrides, "stage_a": stage_a, "stage_b": stage_b}


def write_stage_d_run(root: Path, cogvideox_dir: str | Path) -> dict:
    """A stage (c) checkpoint with non-trivial trained parts, and 4 conditions (one clip untagged,
    ``STAGE_D_UNCAPTIONED``: left out). Returns ``root``, the stage (d) overrides, the stage (c) run and its decoder
    config."""
    write_stage_b_data(root, films=1, clips_per_film=4, num_slots=DECODER_SLOTS, shot_dim=SHOT_DIM,
                       uncaptioned=(STAGE_D_UNCAPTIONED,))
    torch.manual_seed(0)
    cfg = tiny_decoder_config(cogvideox_dir)
    stage_c = root / "stage_c"
    write_decoder_run(cfg, stage_c, 3, torch.Generator().manual_seed(1))
    overrides = [
        f"decoder.pretrained={cogvideox_dir}",
        f"data.manifest={root / 'clips.jsonl'}",
        f"stage_c_checkpoint={stage_c / 'checkpoints' / 'latest'}",
        f"conditions={root / 'shot_targets'}",
        "teacher.num_frames=5",  # 2 latent frames of 8x12
        "teacher.steps=8",
        "student_steps=2",
        "train.log_every=1",
        "train.lr_warmup_steps=0",
    ]
    return {"root": root, "overrides": overrides, "stage_c": stage_c, "decoder_cfg": cfg}
