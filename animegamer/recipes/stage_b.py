"""Stage (b): train the next-game-state MLLM (Mistral + LoRA, query slots, resamplers) on windows of shots.

    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml scripts/train_stage_b.py \\
        --config configs/stage_b.yaml
    python scripts/train_stage_b.py --config configs/tiny/stage_b.yaml          # CPU, tiny Mistral
    python scripts/train_stage_b.py --config configs/stage_b.yaml --resume latest   # exact resume

Needs the clip manifest (``data.manifest``, captioned) and the stage (a) shot targets (``shot_targets``: a
TensorStore with ``shot_embeds`` (num_slots, shot_dim) per clip). Windows whose clips lack a target are skipped
and listed in ``output_dir/missing_shot_targets.txt``.

``history_noise`` > 0: the history shots the MLLM reads get Gaussian noise of that fraction of their std (the
targets stay clean), as a game's history holds its own predicted shots, not the encoder's.

``mllm.shot_residual: previous``: the output resampler gives each shot's change from its turn's last history shot
(as the MLLM reads it, noise included), which is added back (``AnimeGamerMLLM.predict_shots``); a turn without
history predicts the shot itself. The checkpoint records it and the game follows it.

Loss = CE(state value tokens) + mse_weight * MSE(s_a) + cosine_weight * (1 - cos(s_a)) [+ identity_weight * the
identity term: the shot's error along the directions in which naming another friend moves s_a, from the shot
targets' identity swaps (animegamer.data.name_swaps)]; the parts are logged
separately (csv/tensorboard/wandb) and shown on the progress bar. Checkpoints (``output_dir/checkpoints/step_X``)
hold the LoRA (peft adapter format), the new token rows and resamplers (safetensors), and the optimizer, scheduler
and RNG state: ``--resume latest`` (``train.resume=latest``) continues exactly. Under DeepSpeed ZeRO-3 and FSDP2
the trained tensors are gathered before saving (animegamer.training.engines); docs/training_at_scale.md has the
engines and multi-node launches.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate.utils import set_seed

from animegamer.config import StageBConfig
from animegamer.data import stage_b as data
from animegamer.data.stage_b import StageBCollator, StageBDataset, move_batch
from animegamer.data.vocabulary import Vocabulary, save_vocabulary
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.mllm_tokenizer import load_tokenizer
from animegamer.training.loop import Recipe, train
from animegamer.training.losses import stage_b_loss


def perturb_history(batch: dict, history_noise: float) -> dict:
    """``batch`` with its history shots read as s_a + N(0, (history_noise * std)^2), std over the batch's history
    shots (no gradient); 0, or a batch without history, is returned as it is (no random draw)."""
    shots = batch["history_shots"]
    if history_noise <= 0 or shots.numel() == 0:
        return batch
    return {**batch, "history_shots": shots + history_noise * shots.detach().std() * torch.randn_like(shots)}


def world_words(dataset: StageBDataset) -> Vocabulary:
    """The words the games offer and check instructions against: those of the clips a run trains on; each film's
    first trained clip's background can open a game."""
    records = dataset.records
    trained = [records[c] for c in sorted({c for w in dataset.windows for c in w.clip_ids})]
    first = {}
    for record in trained:
        if record.film_id not in first or record.clip_index < first[record.film_id].clip_index:
            first[record.film_id] = record
    return Vocabulary.from_shots((r.shot_tags() for r in trained if r.tags),
                                 openers=(r.shot_tags() for r in first.values() if r.tags))


class StageB(Recipe):
    """Stage (b): the MLLM's LoRA, new token rows and resamplers train on windows of shots."""

    config_class = StageBConfig
    project = "stage_b"

    def build(self, resume) -> None:
        cfg = self.cfg
        set_seed(cfg.seed)  # the same initialisation on every process
        # the data before the model: bad input fails in seconds, not after loading 7B
        self.tokenizer = load_tokenizer(cfg.mllm.pretrained, cfg.mllm.vocabulary, cfg.mllm.num_slots)
        self.dataset = data.build_dataset(cfg, self.accelerator, self.tokenizer[0])
        self.summary = (f"{len(self.dataset)} windows; {self.accelerator.num_processes} process(es); batch "
                        f"{cfg.train.batch_size} x {cfg.train.grad_accum}")
        # The sampler, not accelerate, shards batches over ranks: batch b of a run is a pure function of (seed, b).
        tokenizer = self.dataset.layout.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.collator = StageBCollator(pad_id=pad_id, max_seq_len=cfg.max_seq_len, pack=cfg.pack_sequences)
        self.vocabulary = world_words(self.dataset)
        self.model = AnimeGamerMLLM.from_config(cfg.mllm, tokenizer=self.tokenizer)  # the data's own tokenizer

    def compile(self) -> None:
        self.model.compile_blocks()

    def load_weights(self, checkpoint: Path) -> None:
        self.model.load_trained(checkpoint)

    def to_device(self, batch: dict) -> dict:
        return move_batch(batch, self.accelerator.device)

    def tokens(self, batch: dict) -> int:
        return batch["num_tokens"]

    def loss(self, model, core, batch, step, micro):
        batch = perturb_history(batch, self.cfg.history_noise)  # LoRA dropout, history noise differ per process
        cfg = self.cfg
        return stage_b_loss(model(batch), batch["target_shots"], cfg.mse_weight, cfg.cosine_weight,
                            cfg.identity_weight, batch.get("target_swaps"), batch.get("swap_mask"))

    def save_weights(self, core, state, checkpoint: Path) -> None:
        core.save_trained(checkpoint, state_dict=state, history_turns=self.cfg.data.history_turns)
        save_vocabulary(self.vocabulary, checkpoint)


def main(argv: list[str] | None = None) -> Path:
    """Train stage (b) from a command line (``--config FILE key=value ... [--resume latest|PATH]``)."""
    return train(StageB, __doc__, argv)
