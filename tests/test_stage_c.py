"""Stage (c): the MLLM predictions cache, decoder-only adaptation, exact resume, configs."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from animegamer.config import load_config
from animegamer.data.manifest import read_manifest
from animegamer.data.stage_b import clip_turn
from animegamer.data.stage_c import (
    StageCDataset,
    fill_predictions,
    history_of,
    prediction_settings,
    select_windows,
)
from animegamer.data.tensor_store import TensorStore
from animegamer.models.mllm_turn import HistoryTurn, predict_turn
from animegamer.models.trained import load_decoder
from animegamer.models.weights import load_state_dict_file
from animegamer.recipes import stage_c as train_stage_c
from animegamer.training.checkpoint import list_checkpoints
from tests.helpers.stage_b_data import clip_id
from tests.helpers.stage_runs import DECODER_SLOTS as SLOTS
from tests.helpers.stage_runs import SHOT_DIM
from tests.helpers.stage_runs import STAGE_C_CONFIG as TINY_CONFIG
from tests.helpers.stage_runs import STAGE_C_NO_FEATURES as NO_FEATURES
from tests.helpers.stage_runs import STAGE_C_NO_TARGET as NO_TARGET
from tests.helpers.stage_scripts import (
    ROOT,
    check_bad_resumes_leave_the_run_alone,
    launch_two_processes,
    logged_losses,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]




def _digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _argv(runs, out: Path, *extra: str) -> list[str]:
    return ["--config", str(TINY_CONFIG), *runs["overrides"], f"output_dir={out}", *extra]  # cache: out/predictions


def _trained(step_dir: Path) -> dict[str, torch.Tensor]:
    return {**load_state_dict_file(step_dir / "decoder/adapter_model.safetensors"),
            **{f"motion.{k}": v for k, v in load_state_dict_file(step_dir / "decoder/motion_embedding.safetensors")
               .items()}}


def test_predictions_are_teacher_forced_made_once_and_checked(stage_c_runs, tmp_path, monkeypatch, capsys):
    calls = []
    real = train_stage_c.load_frozen_mllm

    def counting(cfg, device):  # a spy: counts, then loads the real MLLM
        calls.append(cfg.stage_b_checkpoint)
        return real(cfg, device)

    monkeypatch.setattr(train_stage_c, "load_frozen_mllm", counting)
    stage_b_before = _digest(stage_c_runs["stage_b"])
    out = tmp_path / "run"
    train_stage_c.main(_argv(stage_c_runs, out, "train.max_steps=1"))
    printed = capsys.readouterr().out
    assert len(calls) == 1 and "MLLM predictions: 5 made, 0 already cached" in printed

    # film 0: clip 2 lacks a target, so windows 2 and 3 (history [1, 2]) go; film 1: clip 3 lacks features
    cache = TensorStore(out / "predictions")
    expected = [clip_id(0, 0), clip_id(0, 1), clip_id(1, 0), clip_id(1, 1), clip_id(1, 2)]
    assert sorted(cache.clip_ids()) == expected
    left_out = (out / "left_out.txt").read_text()
    assert f"({NO_FEATURES}): no precomputed features" in left_out
    assert f"({clip_id(0, 3)}): no stage (a) shot target" in left_out and NO_TARGET in left_out
    assert "left out 3 clip(s)" in printed

    # a cached prediction is predict_turn on the teacher-forced history: stage (a) targets + true values
    cfg = load_config(TINY_CONFIG, _argv(stage_c_runs, out)[2:])
    manifest = read_manifest(cfg.data.manifest)
    records, targets = manifest.by_id(), TensorStore(cfg.shot_targets)
    mllm = real(cfg, "cpu")
    windows, _ = select_windows(cfg, manifest, mllm.layout)
    window = next(w for w in windows if w.current == clip_id(1, 2))
    assert window.history == (clip_id(1, 0), clip_id(1, 1))  # data.history_turns=2
    history = history_of(window, records, targets)
    torch.testing.assert_close(history[1].shot_embeds, targets.load(clip_id(1, 1))["shot_embeds"])
    assert history[1].values == records[clip_id(1, 1)].shot_tags().values
    expected_shot = predict_turn(mllm, history, clip_turn(records[window.current]).instruction).shot_embeds
    cached = cache.load(window.current)["shot_embeds"]
    assert cached.shape == (SLOTS, SHOT_DIM)
    torch.testing.assert_close(cached, expected_shot)
    without_history = predict_turn(mllm, [], clip_turn(records[window.current]).instruction).shot_embeds
    assert not torch.allclose(cached, without_history)

    # filling reads the MLLM only: its weights stay bit for bit, and it never gets a gradient
    before = {k: v.clone() for k, v in mllm.state_dict().items()}
    fill_predictions(mllm, windows, manifest, targets, tmp_path / "again", prediction_settings(cfg), progress=False)
    assert all(torch.equal(v, mllm.state_dict()[k]) for k, v in before.items())
    assert not any(p.requires_grad or p.grad is not None for p in mllm.parameters())
    torch.testing.assert_close(TensorStore(tmp_path / "again").load(window.current)["shot_embeds"], cached)
    assert _digest(stage_c_runs["stage_b"]) == stage_b_before

    # a second run (a new output dir, the same cache) reuses the predictions and never loads the MLLM
    index_before = (out / "predictions" / "index.json").read_text()
    reuse = f"predictions_cache={out / 'predictions'}"
    train_stage_c.main(_argv(stage_c_runs, tmp_path / "rerun", "train.max_steps=1", reuse))
    assert len(calls) == 1 and "MLLM predictions" not in capsys.readouterr().out
    assert (out / "predictions" / "index.json").read_text() == index_before

    # a cache made with other window settings is refused, not reused
    with pytest.raises(SystemExit):
        train_stage_c.main(_argv(stage_c_runs, out, "data.history_turns=1"))
    assert "made with other windows" in capsys.readouterr().err and len(calls) == 1
    with pytest.raises(SystemExit):
        train_stage_c.main(_argv(stage_c_runs, tmp_path / "none", f"stage_a_checkpoint={tmp_path / 'nowhere'}"))
    assert "checkpoint not found" in capsys.readouterr().err and len(calls) == 1


def test_own_history_predicts_each_film_from_its_own_earlier_predictions(stage_c_runs, tmp_path, capsys):
    """history=own: a clip's history is what the MLLM itself predicted for the earlier clips, played from the
    film's start (shots and values), as in a game; the cache keeps the values, is resumable, and is told apart
    from a teacher-forced one."""
    cfg = load_config(TINY_CONFIG, _argv(stage_c_runs, tmp_path / "x", "history=own")[2:])
    assert cfg.history == "own"
    manifest = read_manifest(cfg.data.manifest)
    records, targets = manifest.by_id(), TensorStore(cfg.shot_targets)
    mllm = train_stage_c.load_frozen_mllm(cfg, "cpu")
    windows, _ = select_windows(cfg, manifest, mllm.layout)
    settings = prediction_settings(cfg)
    assert settings["compare"]["history"] == "own"
    summary = fill_predictions(mllm, windows, manifest, targets, tmp_path / "own", settings, progress=False,
                               history="own")
    assert summary.written == 5
    # play film 1 turn by turn, each prediction fed back as history (history_turns=2)
    played, history = [], []
    for index in range(3):
        instruction = clip_turn(records[clip_id(1, index)]).instruction
        prediction = predict_turn(mllm, history[-2:], instruction)
        played.append(prediction)
        history.append(HistoryTurn(instruction, prediction.shot_embeds, prediction.values))
    own = TensorStore(tmp_path / "own")
    for index, prediction in enumerate(played):
        entry = own.load(clip_id(1, index))
        torch.testing.assert_close(entry["shot_embeds"], prediction.shot_embeds)
        v = prediction.values
        assert entry["values"].tolist() == [v.motion_level, v.social, v.entertainment, v.stamina]
    teacher = tmp_path / "teacher"
    fill_predictions(mllm, windows, manifest, targets, teacher, prediction_settings(
        load_config(TINY_CONFIG, _argv(stage_c_runs, tmp_path / "x")[2:])), progress=False)
    first, third = clip_id(1, 0), clip_id(1, 2)  # no history: the same; with history: not
    torch.testing.assert_close(TensorStore(teacher).load(first)["shot_embeds"], own.load(first)["shot_embeds"])
    assert not torch.allclose(TensorStore(teacher).load(third)["shot_embeds"], own.load(third)["shot_embeds"])

    # resumable: a fill stopped after the first two clips of film 1 ends with the same predictions
    part = tmp_path / "part"
    fill_predictions(mllm, [w for w in windows if w.current in (clip_id(1, 0), clip_id(1, 1))], manifest, targets,
                     part, settings, progress=False, history="own")
    assert fill_predictions(mllm, windows, manifest, targets, part, settings, progress=False,
                            history="own").cached == 2
    torch.testing.assert_close(TensorStore(part).load(third)["shot_embeds"], own.load(third)["shot_embeds"])
    # a teacher-forced cache is refused for history=own, and the choice is checked
    with pytest.raises(SystemExit):
        train_stage_c.main(_argv(stage_c_runs, tmp_path / "mixed", "history=own", f"predictions_cache={teacher}"))
    assert "made with other history" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_stage_c.main(_argv(stage_c_runs, tmp_path / "bad", "history=mine"))
    assert "history='mine' is not one of ['teacher', 'own']" in capsys.readouterr().err


def test_only_the_decoder_trains_and_resume_is_exact(stage_c_runs, tmp_path, capsys):
    common = ["train.checkpoint_every=1", "train.keep_checkpoints=10", "train.lr=3e-3"]
    straight = train_stage_c.main(_argv(stage_c_runs, tmp_path / "a", *common, "train.max_steps=4"))
    steps = list_checkpoints(straight)
    assert [p.name for p in steps] == [f"step_000000{i}" for i in (1, 2, 3, 4)]
    for name in ("decoder/adapter_config.json", "decoder/adapter_model.safetensors",
                 "decoder/motion_embedding.safetensors", "decoder/decoder_config.json", "optimizer.bin",
                 "trainer_state.json"):
        assert (steps[-1] / name).is_file(), name
    assert not (steps[-1] / "encoder").exists()

    # it starts from stage (a)'s decoder and moves only its LoRA + motion embedding
    start = _trained(stage_c_runs["stage_a"] / "checkpoints" / "step_0000007")
    w = [_trained(p) for p in steps]
    assert start.keys() == w[0].keys()
    assert all(torch.allclose(start[k], w[0][k], atol=5e-3) for k in start)  # one Adam step (lr 3e-3) away
    assert any(not torch.equal(w[0][k], w[3][k]) for k in start if "lora_B" in k)
    assert not torch.equal(w[0]["motion.linear_2.weight"], w[3]["motion.linear_2.weight"])
    optimizer = torch.load(steps[-1] / "optimizer.bin", weights_only=True)
    cfg = load_config(TINY_CONFIG, _argv(stage_c_runs, straight)[2:])
    decoder = load_decoder(steps[-1], cfg.decoder, with_vae=False)  # the inference loader takes the checkpoint
    trainable = decoder.trainable_parameters()
    assert sum(len(g["params"]) for g in optimizer["param_groups"]) == len(trainable) == len(optimizer["state"])
    assert sorted(tuple(s["exp_avg"].shape) for s in optimizer["state"].values()) == sorted(
        tuple(p.shape) for p in trainable
    )
    torch.testing.assert_close(decoder.transformer.ofs_embedding.linear_2.weight, w[3]["motion.linear_2.weight"])
    losses = logged_losses(straight)
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))

    # exact resume: 2 steps, stop, resume to 4 == 4 straight steps
    train_stage_c.main(_argv(stage_c_runs, tmp_path / "b", *common, "train.max_steps=2"))
    resumed = train_stage_c.main(
        _argv(stage_c_runs, tmp_path / "b", *common, "train.max_steps=4", "--resume", "latest")
    )
    assert "resumed from" in capsys.readouterr().out
    final = _trained(list_checkpoints(resumed)[-1])
    for k, v in w[3].items():
        torch.testing.assert_close(final[k], v, rtol=0, atol=1e-6, msg=k)
    assert logged_losses(resumed) == pytest.approx(losses, abs=1e-6)


@pytest.mark.parametrize("motion_loss_weight", [0.0, 10.0])
def test_overfitting_one_batch(stage_c_runs, motion_loss_weight):
    overrides = ["condition_dropout=0.0", f"motion_loss_weight={motion_loss_weight}"]
    cfg = load_config(TINY_CONFIG, _argv(stage_c_runs, stage_c_runs["root"] / "unused")[2:] + overrides)
    # the stage (a) targets stand in for MLLM predictions: the loss and the decoder are what is tested here
    items = [(clip_id(1, i), i + 1) for i in range(3)]
    dataset = StageCDataset(cfg.data.features_dir, cfg.shot_targets, items)
    batch = {k: torch.stack([dataset[i][k] for i in range(3)]) for k in dataset[0]}
    assert batch["latents"].shape == (3, 2, 4, 4, 6) and batch["shot_embeds"].shape == (3, SLOTS, SHOT_DIM)
    decoder = train_stage_c.build_decoder(cfg)
    optimizer = torch.optim.AdamW(decoder.trainable_parameters(), lr=2e-2)
    frozen = {n: p.clone() for n, p in decoder.named_parameters() if not p.requires_grad}
    losses = []
    for _ in range(60):
        torch.manual_seed(1)  # the same noise and timesteps every step: one fixed batch to memorise
        loss = train_stage_c.compute_loss(decoder, decoder, batch, cfg)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(torch.equal(p, frozen[n]) for n, p in decoder.named_parameters() if not p.requires_grad)


def test_two_processes_share_the_predictions(stage_c_runs, tmp_path):
    out = tmp_path / "ddp"
    result = launch_two_processes(
        "train_stage_c",
        _argv(stage_c_runs, out, "train.max_steps=2", "train.batch_size=1", "train.checkpoint_every=2"),
        TOKENIZERS_PARALLELISM="false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "run_info.json").read_text())["num_processes"] == 2
    assert (out / "checkpoints" / "step_0000002" / "random_states_1.pkl").is_file()
    assert result.stdout.count("MLLM predictions: 5 made") == 1
    # the two processes' shares, gathered and written by the main one, are the single-process predictions
    cfg = load_config(TINY_CONFIG, _argv(stage_c_runs, out)[2:])
    manifest = read_manifest(cfg.data.manifest)
    mllm = train_stage_c.load_frozen_mllm(cfg, "cpu")
    windows, _ = select_windows(cfg, manifest, mllm.layout)
    targets = TensorStore(cfg.shot_targets)
    fill_predictions(mllm, windows, manifest, targets, tmp_path / "one", prediction_settings(cfg), progress=False)
    two, one = TensorStore(out / "predictions"), TensorStore(tmp_path / "one")
    assert sorted(two.clip_ids()) == sorted(one.clip_ids()) and len(one) == 5
    for cid in one.clip_ids():
        torch.testing.assert_close(two.load(cid)["shot_embeds"], one.load(cid)["shot_embeds"])


# ---------------------------------------------------------------- configs


def test_configs_line_up_with_stages_a_and_b():
    paper = load_config(ROOT / "configs" / "stage_c.yaml")
    assert paper.train.lr == 5e-5 and paper.train.max_steps == 10000
    tiny = load_config(TINY_CONFIG)
    pairs = ((paper, "stage_a.yaml", "stage_b.yaml"), (tiny, "tiny/stage_a.yaml", "tiny/stage_b.yaml"))
    for c, a_path, b_path in pairs:
        a, b = load_config(ROOT / "configs" / a_path), load_config(ROOT / "configs" / b_path)
        assert c.decoder == a.decoder  # the stage (a) decoder it continues
        assert (c.data.manifest, c.data.features_dir) == (a.data.manifest, a.data.features_dir)
        assert c.stage_a_checkpoint == f"{a.output_dir}/checkpoints/latest"
        assert c.shot_targets == b.shot_targets == f"{a.output_dir}/shot_targets"
        assert c.stage_b_checkpoint == f"{b.output_dir}/checkpoints/latest"
        trained = ("pretrained", "vocabulary", "num_slots", "shot_dim", "lora_rank", "lora_alpha", "lora_targets")
        assert all(getattr(c.mllm, k) == getattr(b.mllm, k) for k in trained)  # the stage (b) MLLM it loads
        assert (c.data.history_turns, c.data.split, c.max_seq_len) == (b.data.history_turns, b.data.split,
                                                                         b.max_seq_len)
        assert c.predictions_cache == ""  # <output_dir>/predictions
    inference = load_config(ROOT / "configs" / "tiny" / "inference.yaml")
    assert inference.decoder_checkpoint == f"{tiny.output_dir}/checkpoints/latest"


def test_a_bad_resume_fails_in_one_line_and_leaves_the_finished_run_alone(stage_c_runs, tmp_path, capsys):
    out = train_stage_c.main(_argv(stage_c_runs, tmp_path / "done", "train.max_steps=1", "train.checkpoint_every=1"))
    check_bad_resumes_leave_the_run_alone(
        train_stage_c.main, lambda *extra: _argv(stage_c_runs, out, *extra), out, capsys
    )
