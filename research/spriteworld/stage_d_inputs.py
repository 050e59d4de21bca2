"""Rebuild what stage (d) reads from a shipped SpriteWorld checkpoint, without retraining a stage: the stage (c)
predictions cache (the MLLM's s_a of every training clip) and a stage (c) checkpoint to distil from.

    python scripts/spriteworld/train.py --config configs/spriteworld/run.yaml "steps=[data]"   # the films (~90 s)
    python research/spriteworld/stage_d_inputs.py --run-dir outputs/spriteworld --ship-dir checkpoints/spriteworld
    python scripts/spriteworld/train.py --config configs/spriteworld/run.yaml "steps=[stage_d4,stage_d1]"

``--upto targets`` stops after the features and the shipped encoder's shot targets (with their identity swaps):
what a stage (b) variant reads (``shot_targets`` of stage_b.yaml), e.g. a stage (b) retrained with another
``identity_weight`` on the shipped stage (a). ``--upto features`` stops after the features; ``--figure-masks`` adds
each clip's ``figure_mask`` to them, which the base transformer's pretraining weighs its loss with (more steps on
the shipped transformer: ``scripts/spriteworld/pretrain.py ... resume_vae=true init_transformer=...`` reads these
features):

    python research/spriteworld/stage_d_inputs.py --upto features --figure-masks

A fresh clone has the shipped weights but no ``outputs/``: stage (d) needs ``<run>/stage_c/predictions`` and
``<run>/stage_c/checkpoints/latest``. This copies the shipped pretrained models into ``<run>/models``, computes
the stage (a) features of every clip with the shipped VAE, T5 and CLIP (batched, as pretraining does; no figure
masks unless ``--figure-masks``: nothing after pretraining reads them), the shipped stage (a) encoder's shot
targets, then runs scripts/train_stage_c.py's prediction step with the shipped stage (b) MLLM (one training step into
``<run>/stage_c_predictions``, discarded) and links the shipped stage (c) decoder in as ``<run>/stage_c``'s latest
checkpoint. Features and predictions come from the same weights and code as the shipped run's (the chain is
deterministic); that they equal that run's bit for bit has not been checked (its outputs were not kept). Each part
is kept once complete (a rerun skips finished features and cached predictions); on 2 shared CPU cores the features
took 55 min and the predictions about 2 s a clip under a load average of 7-13.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from animegamer.config import T5Config, load_config
from animegamer.data.features import write_shot_targets
from animegamer.data.manifest import read_manifest
from animegamer.data.tensor_store import INDEX, TensorStore
from animegamer.io import atomic_write_text
from animegamer.models.t5_text import T5TextFeatures
from animegamer.models.trained import load_encoder
from animegamer.models.vae import load_vae
from animegamer.recipes import stage_c as stage_c_recipe
from animegamer.spriteworld.pretrain_transformer import fill_features

ROOT = Path(__file__).resolve().parents[2]


def has_figure_masks(features_dir: Path) -> bool:
    """Whether the feature store's first clip carries a ``figure_mask`` (fill_features writes all or none)."""
    store = TensorStore(features_dir)
    clips = store.clip_ids()
    return bool(clips) and "figure_mask" in store.load(clips[0])


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="outputs/spriteworld", help="the run's output_dir (after steps=[data])")
    parser.add_argument("--ship-dir", default="checkpoints/spriteworld", help="the shipped checkpoint")
    parser.add_argument("--upto", choices=("features", "targets", "predictions"), default="predictions",
                        help="features: stop after the stage (a) features; targets: after them and the shot targets "
                             "(what stage (b) reads)")
    parser.add_argument("--figure-masks", action="store_true",
                        help="store each clip's figure_mask with its features (what pretraining's loss weighs)")
    args = parser.parse_args(argv)
    run, ship = Path(args.run_dir), Path(args.ship_dir)
    configs = run / "configs"
    for needed in (configs / "pretrain.yaml", run / "data" / "train.jsonl", ship / "stage_b", ship / "stage_c"):
        if not needed.exists():
            raise SystemExit(f"error: {needed} is missing (run the data step of scripts/spriteworld/train.py first "
                             "with the same output_dir; --ship-dir must be a shipped SpriteWorld checkpoint)")
    for model in ("clip", "CogVideoX", "Mistral"):
        if not (run / "models" / model).is_dir():
            shutil.copytree(ship / model, run / "models" / model)

    pretrain = load_config(configs / "pretrain.yaml")
    features = Path(pretrain.data.features_dir)
    present = (features / INDEX).is_file()
    if present and args.figure_masks and not has_figure_masks(features):
        raise SystemExit(f"error: {features} holds features without figure masks; move it aside to rebuild them "
                         "with --figure-masks")
    if not present:
        vae = load_vae(load_config(configs / "stage_a.yaml").decoder)
        t5 = T5TextFeatures.from_config(T5Config(path=pretrain.output_dir, max_length=pretrain.text_tokens))
        with torch.no_grad():
            fill_features(pretrain, vae, read_manifest(pretrain.data.manifest), t5, figure_masks=args.figure_masks)
    if args.upto == "features":
        print(f"features: {features}" + (" (with figure masks)" if args.figure_masks else ""))
        return features
    stage_a = load_config(configs / "stage_a.yaml")
    targets = write_shot_targets(load_encoder(ship / "stage_a"), stage_a.data.features_dir,
                                 Path(stage_a.output_dir) / "shot_targets",
                                 source={"checkpoint": str(ship / "stage_a")})
    if args.upto == "targets":
        print(f"stage (b) inputs: {stage_a.data.features_dir} and {targets}")
        return targets

    stage_c = load_config(configs / "stage_c.yaml")
    predictions = Path(stage_c.output_dir) / "predictions"
    stage_c_recipe.main([
        "--config", str(configs / "stage_c.yaml"), f"stage_a_checkpoint={ship / 'stage_a'}",
        f"stage_b_checkpoint={ship / 'stage_b'}", "train.max_steps=1", "train.checkpoint_every=1",
        f"output_dir={run / 'stage_c_predictions'}", f"predictions_cache={predictions}"])
    # the shipped stage (c) decoder as the run's latest checkpoint: stage_d*.yaml's stage_c_checkpoint
    step = Path(stage_c.output_dir) / "checkpoints" / "step_0001000"
    if not step.is_dir():
        shutil.copytree(ship / "stage_c", step)
    atomic_write_text(step.parent / "latest", step.name)
    print(f"stage (d) inputs: {predictions} and {step}")
    return predictions


if __name__ == "__main__":
    main()
