import csv

import pytest
import torch
from torch import nn

from animegamer.config import StageAConfig, TrainConfig
from animegamer.models.weights import load_state_dict_file, save_state_dict_file
from animegamer.training.batches import ResumableBatchSampler
from animegamer.training.checkpoint import (
    find_resume,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    skip_model_weights_in_state,
)
from animegamer.training.optim import build_optimizer, build_scheduler, lr_factor
from animegamer.training.run import build_accelerator, start_run


def test_sampler_is_a_pure_function_of_position():
    full = ResumableBatchSampler(10, batch_size=3, seed=1)
    it = iter(full)
    first = [next(it) for _ in range(8)]
    resumed = iter(ResumableBatchSampler(10, batch_size=3, seed=1, start_batch=5))
    assert [next(resumed) for _ in range(3)] == first[5:]
    # every epoch covers every item once
    flat = [i for b in first for i in b][:20]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    # ranks split the global batch without overlap
    r0 = next(iter(ResumableBatchSampler(10, 2, seed=1, rank=0, world_size=2)))
    r1 = next(iter(ResumableBatchSampler(10, 2, seed=1, rank=1, world_size=2)))
    assert not set(r0) & set(r1) and len(r0 + r1) == 4
    with pytest.raises(ValueError):
        ResumableBatchSampler(0, 2)


def test_lr_schedules():
    t = TrainConfig(max_steps=110, lr_warmup_steps=10, lr_scheduler="cosine")
    assert lr_factor(0, t) == pytest.approx(0.1) and lr_factor(9, t) == pytest.approx(1.0)
    assert lr_factor(60, t) == pytest.approx(0.5) and lr_factor(110, t) == pytest.approx(0.0, abs=1e-9)
    assert lr_factor(50, TrainConfig(lr_scheduler="constant")) == 1.0
    assert lr_factor(60, TrainConfig(max_steps=110, lr_warmup_steps=10, lr_scheduler="linear")) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no trainable"):
        build_optimizer([], t)


def _toy_run(tmp_path, steps, resume=""):
    cfg = StageAConfig(output_dir=str(tmp_path))
    cfg.train = TrainConfig(max_steps=4, lr=0.05, report_to="csv", checkpoint_every=2, resume=resume)
    acc = build_accelerator(cfg.output_dir, cfg.train)
    skip_model_weights_in_state(acc)
    start_run(acc, cfg, "toy")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = build_optimizer(model.parameters(), cfg.train)
    sched = build_scheduler(opt, cfg.train)
    model, opt, sched = acc.prepare(model, opt, sched)
    data = torch.arange(40, dtype=torch.float32).reshape(10, 4) / 40

    def save(d):
        save_state_dict_file(acc.unwrap_model(model).state_dict(), d / "model.safetensors")

    def load(d):
        acc.unwrap_model(model).load_state_dict(load_state_dict_file(d / "model.safetensors"))

    step = 0
    found = find_resume(cfg.output_dir, cfg.train.resume)
    if found:
        step = load_checkpoint(acc, found, load)["step"]
    batches = iter(ResumableBatchSampler(10, 2, seed=0, start_batch=step))
    while step < steps:
        idx = next(batches)
        noise = torch.randn(2, 1)  # drawn from the (restored) global RNG
        loss = (model(data[idx]) - noise).pow(2).mean()
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        acc.log({"loss": loss.item()}, step=step)
        if step % cfg.train.checkpoint_every == 0:
            save_checkpoint(acc, cfg.output_dir, step, save, {"loss": loss.item()}, keep=1)
    acc.end_training()
    return {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}


def test_exact_resume_and_checkpoint_files(tmp_path):
    straight = _toy_run(tmp_path / "a", 4)
    _toy_run(tmp_path / "b", 2)
    resumed = _toy_run(tmp_path / "b", 4, resume="latest")
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    ckpts = list_checkpoints(tmp_path / "b")
    assert [p.name for p in ckpts] == ["step_0000004"]  # keep=1 pruned step 2
    assert (ckpts[0] / "model.safetensors").is_file() and (ckpts[0] / "trainer_state.json").is_file()
    assert not list((tmp_path / "b" / "checkpoints").glob("*.tmp"))
    assert resolve_checkpoint(tmp_path / "b") == ckpts[0]
    assert resolve_checkpoint(tmp_path / "b" / "checkpoints" / "latest") == ckpts[0]
    assert (tmp_path / "b" / "config.yaml").read_text().startswith("kind: stage_a")
    assert "git_sha" in (tmp_path / "b" / "run_info.json").read_text()
    rows = list(csv.DictReader(open(tmp_path / "b" / "metrics.csv")))
    assert [int(r["step"]) for r in rows if r["name"] == "loss"] == [1, 2, 3, 4]
    with pytest.raises(FileNotFoundError):
        resolve_checkpoint(tmp_path / "nothing")
    assert find_resume(tmp_path / "empty", "latest") is None and find_resume(tmp_path, "") is None
