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

Loss = CE(state value tokens) + mse_weight * MSE(s_a) + cosine_weight * (1 - cos(s_a)); the parts are logged
separately (csv/tensorboard/wandb) and shown on the progress bar. Checkpoints (``output_dir/checkpoints/step_X``)
hold the LoRA (peft adapter format), the new token rows and resamplers (safetensors), and the optimizer, scheduler
and RNG state: ``--resume latest`` (``train.resume=latest``) continues exactly. Under DeepSpeed ZeRO-3 and FSDP2
the trained tensors are gathered before saving (animegamer.training.engines); docs/training_at_scale.md has the
engines and multi-node launches.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from animegamer.cli import fail
from animegamer.config import StageBConfig
from animegamer.data.manifest import ManifestError, read_manifest
from animegamer.data.sequences import windows_from_config
from animegamer.data.stage_b import StageBCollator, StageBDataset, filter_windows, move_batch
from animegamer.data.tensor_store import TensorStore
from animegamer.inference.vocabulary import Vocabulary, save_vocabulary
from animegamer.io import atomic_write_text
from animegamer.models.mllm import AnimeGamerMLLM, load_tokenizer
from animegamer.tokens import TurnLayout, get_vocabulary
from animegamer.training.batches import resumable_batches
from animegamer.training.checkpoint import save_checkpoint, skip_model_weights_in_state
from animegamer.training.engines import (
    configure_deepspeed,
    gather_trained_state,
    optimizer_step,
    seed_process,
)
from animegamer.training.optim import build_optimizer, build_scheduler
from animegamer.training.program import releases_output_dir, run_program
from animegamer.training.recipe import resume_point
from animegamer.training.run import build_accelerator, end_run, parse_stage_config, restore, start_run

LOSS_PARTS = ("loss", "ce", "mse", "cos", "state_acc")


def build_dataset(cfg: StageBConfig, accelerator) -> StageBDataset:
    """Windows of the configured split whose shots all have cached targets, laid out with the MLLM's tokenizer."""
    manifest = read_manifest(cfg.data.manifest)
    windows = windows_from_config(manifest, cfg.data)
    store = TensorStore(cfg.shot_targets)
    if len(store) == 0:
        raise FileNotFoundError(
            f"no shot targets in {cfg.shot_targets}; cache the stage (a) encoder's s_a of every clip first"
        )
    kept, missing = filter_windows(windows, store)
    tokenizer, _ = load_tokenizer(cfg.mllm.pretrained, cfg.mllm.vocabulary, cfg.mllm.num_slots)
    layout = TurnLayout(tokenizer, get_vocabulary(cfg.mllm.vocabulary), cfg.mllm.num_slots)
    dataset = StageBDataset(kept, manifest, store, layout, cfg.max_seq_len, cfg.mllm.shot_dim)
    if accelerator.is_main_process:
        print(f"stage (b) data: {len(dataset)} windows ({cfg.data.split} split) from {cfg.data.manifest}")
        if missing:
            report = Path(cfg.output_dir) / "missing_shot_targets.txt"
            atomic_write_text(report, "".join(f"{cid}\n" for cid in missing))
            print(
                f"warning: {len(missing)} clips have no shot target in {cfg.shot_targets}; skipped "
                f"{len(windows) - len(kept)} windows (clip ids in {report})"
            )
        if dataset.trimmed or dataset.too_long:
            print(
                f"note: {dataset.trimmed} windows lost history turns to fit max_seq_len={cfg.max_seq_len}; "
                f"{len(dataset.too_long)} dropped as too long"
            )
    return dataset


def perturb_history(batch: dict, history_noise: float) -> dict:
    """``batch`` with its history shots read as s_a + N(0, (history_noise * std)^2), std over the batch's history
    shots (no gradient); 0, or a batch without history, is returned as it is (no random draw)."""
    shots = batch["history_shots"]
    if history_noise <= 0 or shots.numel() == 0:
        return batch
    return {**batch, "history_shots": shots + history_noise * shots.detach().std() * torch.randn_like(shots)}


@releases_output_dir
def main(argv: list[str] | None = None) -> None:
    cfg = parse_stage_config(StageBConfig, __doc__, argv)
    train = cfg.train
    out_dir = Path(cfg.output_dir)
    accelerator = build_accelerator(cfg.output_dir, train)
    skip_model_weights_in_state(accelerator)
    set_seed(cfg.seed)  # the same initialisation on every process
    # data and the resume checkpoint before the model (bad input fails in seconds, not after loading 7B) and before
    # anything of the run is written (a failed retry leaves a finished run's config.yaml and run_info.json alone)
    try:
        resume = resume_point(cfg, accelerator)
        dataset = build_dataset(cfg, accelerator)
    except (ManifestError, FileNotFoundError, ValueError) as exc:  # CheckpointError is a ValueError
        fail(str(exc))

    model = AnimeGamerMLLM.from_config(cfg.mllm, mse_weight=cfg.mse_weight, cosine_weight=cfg.cosine_weight)
    if train.compile:
        model.compile_blocks()
    if resume is not None:
        # before prepare: ZeRO-3 / FSDP then shard the restored values like any others
        try:
            model.load_trained(resume.path)
        except (FileNotFoundError, ValueError) as exc:
            fail(str(exc))
    model.to(accelerator.device)  # before the optimizer: AdamW is fused on CUDA
    optimizer = build_optimizer(model.trainable_parameters(), train)
    scheduler = build_scheduler(optimizer, train)
    configure_deepspeed(accelerator, train)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    unwrapped = accelerator.unwrap_model(model)
    trained_params = [p for p in model.parameters() if p.requires_grad]  # after prepare: the engine's own

    seed_process(cfg.seed, accelerator)  # LoRA dropout and history noise differ per process
    step = restore(accelerator, resume, lambda _path: None, train.allow_rng_reset)  # the weights: loaded above
    start_run(accelerator, cfg, "stage_b", resume)

    # The sampler, not accelerate, shards batches over ranks: batch b of a run is a pure function of (seed, b).
    pad_id = dataset.layout.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else dataset.layout.tokenizer.eos_token_id
    collator = StageBCollator(pad_id=pad_id, max_seq_len=cfg.max_seq_len, pack=cfg.pack_sequences)
    batches = resumable_batches(dataset, accelerator, train, cfg.seed, step, cfg.data.num_workers, collator)

    # the words the games offer and check instructions against: those of the clips this run trains on
    records = dataset.records
    trained = [records[c] for c in sorted({c for w in dataset.windows for c in w.clip_ids})]
    first = {}  # each film's first trained clip: its background can open a game
    for record in trained:
        if record.film_id not in first or record.clip_index < first[record.film_id].clip_index:
            first[record.film_id] = record
    vocabulary = Vocabulary.from_shots((r.shot_tags() for r in trained if r.tags),
                                       openers=(r.shot_tags() for r in first.values() if r.tags))

    def checkpoint(at_step: int, logs: dict) -> None:
        # every process takes part in gathering; the main one writes
        state = gather_trained_state(unwrapped, accelerator.is_main_process)

        def save_weights(path: Path) -> None:
            unwrapped.save_trained(path, state_dict=state)
            save_vocabulary(vocabulary, path)

        save_checkpoint(accelerator, out_dir, at_step, save_weights, logs, keep=train.keep_checkpoints)

    model.train()
    progress = tqdm(total=train.max_steps, initial=step, desc="stage b", disable=not accelerator.is_main_process)
    tokens, started = 0, time.perf_counter()
    while step < train.max_steps:
        parts = torch.zeros(len(LOSS_PARTS), device=accelerator.device)
        for _ in range(train.grad_accum):
            batch = next(batches)
            tokens += batch["num_tokens"]
            batch = perturb_history(move_batch(batch, accelerator.device), cfg.history_noise)
            with accelerator.accumulate(model):
                out = model(batch)
                accelerator.backward(out["loss"])
            parts += torch.stack([out[k].detach().float() for k in LOSS_PARTS]) / train.grad_accum
        lr = scheduler.get_last_lr()[0]  # the rate this step applies
        grad_norm = optimizer_step(accelerator, model, optimizer, scheduler, trained_params, train.max_grad_norm)
        step += 1
        progress.update(1)
        local = dict(zip(LOSS_PARTS, parts.tolist(), strict=True))
        progress.set_postfix({k: f"{v:.4f}" for k, v in local.items()})

        if step % train.log_every == 0 or step == train.max_steps:
            mean = accelerator.reduce(parts, reduction="mean")  # collective: every process logs together
            elapsed = time.perf_counter() - started
            logs = dict(zip(LOSS_PARTS, mean.tolist(), strict=True))
            logs["lr"] = lr
            logs["grad_norm"] = grad_norm
            logs["tokens_per_s"] = tokens * accelerator.num_processes / max(elapsed, 1e-9)
            accelerator.log(logs, step=step)
            tokens, started = 0, time.perf_counter()
        if step % train.checkpoint_every == 0 or step == train.max_steps:
            checkpoint(step, local)

    progress.close()
    end_run(accelerator)
    accelerator.print(f"done: {step} steps; checkpoints in {out_dir / 'checkpoints'}")


if __name__ == "__main__":
    run_program(main)
