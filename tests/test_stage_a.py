"""Stage (a): feature precomputation, the training script on tiny models, checkpoints, resume, shot targets."""

import csv
import dataclasses
import json
from importlib import import_module
from pathlib import Path

import pytest
import torch

from animegamer.config import StageAConfig, load_config
from animegamer.data.features import clip_frame_indices, fit_frames, precompute_features, read_skipped
from animegamer.data.stage_a import StageADataset, build_dataset, select_frame
from animegamer.data.tensor_store import TensorStore
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.trained import load_decoder, load_encoder
from animegamer.models.weights import load_state_dict_file
from animegamer.recipes import stage_a as train_stage_a
from animegamer.training.checkpoint import list_checkpoints
from tests.helpers.clips import make_clip_frames
from tests.helpers.stage_runs import STAGE_A_CONFIG

pytestmark = pytest.mark.slow  # an end-to-end run: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[1]


encode_shots = import_module("scripts.encode_shots")


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    """Tiny models run fastest on one thread; two workers x two threads on two busy cores mostly spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(tmp_dir, data, *extra):
    argv = ["--config", str(STAGE_A_CONFIG), *data["overrides"], f"output_dir={tmp_dir}", "train.report_to=csv",
            *extra]
    return train_stage_a.main(argv)


def _trained(step_dir: Path) -> dict[str, torch.Tensor]:
    out = {f"encoder.{k}": v for k, v in load_state_dict_file(step_dir / "encoder/model.safetensors").items()}
    out |= {f"lora.{k}": v for k, v in load_state_dict_file(step_dir / "decoder/adapter_model.safetensors").items()}
    out |= {
        f"motion.{k}": v for k, v in load_state_dict_file(step_dir / "decoder/motion_embedding.safetensors").items()
    }
    return out


def test_frames_are_fitted_and_sampled():
    frames = make_clip_frames(7, 40, 80)
    fitted = fit_frames(frames, 9, 48, 64)
    assert fitted.shape == (9, 48, 64, 3) and fitted.dtype == torch.uint8
    assert torch.equal(fitted[-1], fitted[-3])  # padded with the last frame
    with pytest.raises(ValueError, match="too short"):
        fit_frames(frames[:3], 9, 48, 64)
    assert clip_frame_indices(9, 4) == [0, 3, 5, 8] and clip_frame_indices(17, 1) == [0]


def test_precompute_stores_fields_and_reports_bad_clips(stage_a_data, capsys):
    cfg, summary = stage_a_data["cfg"], stage_a_data["summary"]
    store = TensorStore(cfg.data.features_dir)
    assert summary.written == 4 and sorted(store.clip_ids()) == [f"film0_{i:05d}" for i in range(4)]
    fields = store.load("film0_00000")
    assert fields["latents"].shape == (4, 3, 6, 8) and fields["latents"].dtype == torch.float32  # (C, F, h, w)
    assert fields["clip_tokens"].shape == (4, 16, 32)  # (K, Nc, Dc), index 0 = first frame
    assert fields["text_tokens"].shape == (226, 32)
    assert not torch.equal(fields["clip_tokens"][0], fields["clip_tokens"][-1])
    skipped = read_skipped(cfg.data.features_dir)
    assert set(skipped) == {"film1_00000", "film1_00001", "film1_00002"}
    assert skipped["film1_00000"]["video"].endswith("broken.mp4") and "decode" in skipped["film1_00000"]["reason"]
    assert "not found" in skipped["film1_00001"]["reason"] and "no tags" in skipped["film1_00002"]["reason"]

    again = precompute_features(cfg, progress=False)  # resumable: nothing new to do, nothing retried
    assert again.written == 0 and again.present == 4 and len(again.skipped) == 3

    dataset, left_out = build_dataset(cfg)
    assert len(dataset) == 4 and len(left_out) == 3 and any("broken.mp4" in line for line in left_out)
    item = dataset[2]
    assert item["latents"].shape == (3, 4, 6, 8) and int(item["motion_level"]) == 4  # (F, C, h, w)
    with pytest.raises(ValueError, match="no usable clips"):
        StageADataset(cfg.data.features_dir, [])

    bad = load_config(STAGE_A_CONFIG, stage_a_data["overrides"] + ["data.height=32"])
    with pytest.raises(ValueError, match="height: 48 -> 32"):
        precompute_features(bad, progress=False)


def test_precompute_writes_identity_swaps_of_the_characters_a_caption_names(stage_a_data, tmp_path):
    """data.identity_swaps: a clip whose motion names another character also stores the T5 tokens of its caption
    with each other character of the manifest named instead (at most that many); the others store none."""
    from animegamer.data.manifest import ClipRecord, write_manifest
    from animegamer.data.name_swaps import SWAP_NAMES_FIELD, SWAP_TEXT_FIELD, names_from_tensor
    from animegamer.models.t5_text import T5TextFeatures
    from tests.helpers.stage_runs import STAGE_A_TAGS

    root = stage_a_data["root"]
    cast = [("Qiqi", "talk with Sam"), ("Sam", "walk"), ("Mia", "run"), ("Ken", "hug Sam and Mia")]
    records = [ClipRecord(f"film0_{i:05d}", str(root / f"clips/c{i}.mp4"), "film0", i, 2.0 * i, 2.0 * i + 2,
                          tags=STAGE_A_TAGS.format(who=who, what=what, level=2), motion_level=2)
               for i, (who, what) in enumerate(cast)]
    write_manifest(tmp_path / "clips.jsonl", records)
    overrides = [*stage_a_data["overrides"], f"data.manifest={tmp_path / 'clips.jsonl'}",
                 f"data.features_dir={tmp_path / 'features'}"]
    cfg = load_config(STAGE_A_CONFIG, [*overrides, "data.identity_swaps=2"])
    assert precompute_features(cfg, progress=False).written == 4
    store = TensorStore(cfg.data.features_dir)
    t5 = T5TextFeatures.from_config(cfg.t5)
    qiqi = store.load("film0_00000")  # names Sam: Sam -> Ken, Sam -> Mia (the manifest's subjects, sorted)
    texts = [records[0].shot_tags().motion_text().replace("Sam", name) for name in ("Ken", "Mia")]
    assert qiqi[SWAP_TEXT_FIELD].shape == (2, 226, 32)
    torch.testing.assert_close(qiqi[SWAP_TEXT_FIELD].float(), t5(texts).float(), atol=2e-2, rtol=2e-2)  # bf16
    assert SWAP_TEXT_FIELD not in store.load("film0_00001") and SWAP_TEXT_FIELD not in store.load("film0_00002")
    assert store.load("film0_00003")[SWAP_TEXT_FIELD].shape == (2, 226, 32)  # two named, one name left, limit 2
    assert names_from_tensor(qiqi[SWAP_NAMES_FIELD]) == [("Sam", "Ken"), ("Sam", "Mia")]  # who for whom, in order
    assert names_from_tensor(store.load("film0_00003")[SWAP_NAMES_FIELD]) == [("Mia", "Qiqi"), ("Sam", "Qiqi")]
    assert SWAP_NAMES_FIELD not in store.load("film0_00001")
    # features without swaps do not serve a run that asks for them; features with swaps serve one that does not
    with pytest.raises(ValueError, match="identity_swaps"):
        precompute_features(load_config(STAGE_A_CONFIG, [*overrides, "data.identity_swaps=1"]), progress=False)
    assert precompute_features(load_config(STAGE_A_CONFIG, overrides), progress=False).present == 4


def test_training_run_checkpoints_warmup_and_resume(stage_a_data, tmp_path, capsys):
    # 4 steps: 2 encoder-only warm-up steps, then 2 joint steps; a checkpoint after every step
    common = ["train.max_steps=4", "warmup_steps=2", "train.checkpoint_every=1", "train.keep_checkpoints=10"]
    straight = _run(tmp_path / "a", stage_a_data, *common)
    printed = capsys.readouterr()
    assert "broken.mp4" in printed.out and "gone.mp4" in printed.out  # bad clips reported by path
    steps = list_checkpoints(straight)
    assert [p.name for p in steps] == [f"step_000000{i}" for i in (1, 2, 3, 4)]
    for name in (
        "encoder/model.safetensors",
        "encoder/config.json",
        "decoder/adapter_config.json",
        "decoder/adapter_model.safetensors",
        "decoder/motion_embedding.safetensors",
        "trainer_state.json",
        "optimizer.bin",
    ):
        assert (steps[-1] / name).is_file(), name
    w = [_trained(p) for p in steps]

    def changed(a, b, prefix):
        return any(not torch.equal(a[k], b[k]) for k in a if k.startswith(prefix))

    # warm-up: the encoder moves, the decoder's trained parts stay at their initial values (LoRA B and the
    # motion embedding's last layer start at zero)
    assert changed(w[0], w[1], "encoder.")
    assert not changed(w[0], w[1], "lora.") and not changed(w[0], w[1], "motion.")
    assert all(not w[1][k].any() for k in w[1] if k.startswith("lora.") and "lora_B" in k)
    assert not w[1]["motion.linear_2.weight"].any()
    # joint: LoRA and the motion embedding move too
    assert changed(w[1], w[2], "lora.") and changed(w[1], w[2], "motion.") and changed(w[1], w[2], "encoder.")

    rows = list(csv.DictReader(open(straight / "metrics.csv")))
    losses = [float(r["value"]) for r in rows if r["name"] == "loss"]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert [int(float(r["value"])) for r in rows if r["name"] == "joint"] == [0, 0, 1, 1]
    decoder_lrs = [float(r["value"]) for r in rows if r["name"] == "lr_decoder"]
    assert decoder_lrs[:2] == [0.0, 0.0] and min(decoder_lrs[2:]) > 0

    # shot targets of every clip with features, from the final encoder
    targets = TensorStore(straight / "shot_targets")
    assert sorted(targets.clip_ids()) == [f"film0_{i:05d}" for i in range(4)]
    shot = targets.load("film0_00001")["shot_embeds"]
    assert shot.shape == (226, 32) and shot.dtype == torch.float32
    encoder = load_encoder(straight)
    feats = TensorStore(stage_a_data["cfg"].data.features_dir).load("film0_00001")
    with torch.no_grad():
        expected = encoder(feats["clip_tokens"][:1].float(), feats["text_tokens"][None].float())[0]
    torch.testing.assert_close(shot, expected)
    assert json.loads((straight / "shot_targets/source.json").read_text())["step"] == 4

    # the trained decoder loads back onto the pretrained one
    cfg = load_config(STAGE_A_CONFIG, stage_a_data["overrides"])
    decoder = load_decoder(straight, cfg.decoder, with_vae=False)
    torch.testing.assert_close(decoder.transformer.ofs_embedding.linear_2.weight, w[3]["motion.linear_2.weight"])

    # encode_shots.py: the targets of any checkpoint (here step 2), through the same loaders
    out = encode_shots.main(
        [
            "--config",
            str(STAGE_A_CONFIG),
            *stage_a_data["overrides"],
            f"output_dir={straight}",
            "--checkpoint",
            str(steps[1]),
            "--out",
            str(tmp_path / "targets_2"),
        ]
    )
    early = TensorStore(out).load("film0_00001")["shot_embeds"]
    with torch.no_grad():
        expected = load_encoder(steps[1])(feats["clip_tokens"][:1].float(), feats["text_tokens"][None].float())[0]
    torch.testing.assert_close(early, expected)
    assert not torch.allclose(early, shot)
    assert json.loads((out / "source.json").read_text())["checkpoint"] == str(steps[1])

    # exact resume: 2 steps, stop, resume to 4 == 4 straight steps
    _run(tmp_path / "b", stage_a_data, *common[1:], "train.max_steps=2")
    resumed = _run(tmp_path / "b", stage_a_data, *common[1:], "train.max_steps=4", "--resume", "latest")
    assert "resumed from" in capsys.readouterr().out
    final = _trained(list_checkpoints(resumed)[-1])
    for k, v in w[3].items():
        torch.testing.assert_close(final[k], v, rtol=0, atol=1e-6, msg=k)


@pytest.mark.parametrize("motion_loss_weight", [0.0, 10.0])
def test_overfitting_one_batch(stage_a_data, motion_loss_weight):
    cfg: StageAConfig = dataclasses.replace(
        stage_a_data["cfg"], condition_dropout=0.0, motion_loss_weight=motion_loss_weight
    )
    dataset, _ = build_dataset(cfg)
    batch = {k: torch.stack([dataset[i][k] for i in range(2)]) for k in dataset[0]}
    torch.manual_seed(0)
    encoder = ActionAwareEncoder.from_config(cfg.encoder)
    decoder = AnimationShotDecoder.from_config(cfg.decoder, with_vae=False)
    decoder.copy_text_projection_to(encoder.text_proj)
    model = train_stage_a.EncoderDecoder(encoder, decoder)
    optimizer = torch.optim.AdamW(list(encoder.parameters()) + decoder.trainable_parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        torch.manual_seed(1)  # the same noise and timesteps every step: one fixed batch to memorise
        loss = train_stage_a.compute_loss(model, model, batch, cfg)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_shot_noise_perturbs_what_the_decoder_reads_and_nothing_else(stage_a_data):
    """shot_noise > 0: the decoder reads s_a + noise of that fraction of s_a's std (the MLLM's predictions are a
    little off); 0 leaves the paper's step as it was; the encoder still gets the gradient through the noise."""
    cfg: StageAConfig = dataclasses.replace(stage_a_data["cfg"], condition_dropout=0.0)
    dataset, _ = build_dataset(cfg)
    batch = {k: torch.stack([dataset[i][k] for i in range(2)]) for k in dataset[0]}
    torch.manual_seed(0)
    encoder = ActionAwareEncoder.from_config(cfg.encoder)
    decoder = AnimationShotDecoder.from_config(cfg.decoder, with_vae=False)
    model = train_stage_a.EncoderDecoder(encoder, decoder)
    seen = []
    hook = decoder.register_forward_pre_hook(lambda _, args: seen.append(args[2].detach().clone()))
    losses = {}
    for noise in (0.0, 0.5):
        torch.manual_seed(1)
        losses[noise] = train_stage_a.compute_loss(model, model, batch, dataclasses.replace(cfg, shot_noise=noise))
    hook.remove()
    clean = encoder(select_frame(batch["clip_tokens"], cfg.encoder.frame), batch["text_tokens"]).detach()
    torch.testing.assert_close(seen[0], clean)  # 0: the encoder's s_a exactly
    added = seen[1] - clean
    assert added.abs().max() > 0 and abs(added.std().item() / clean.std().item() - 0.5) < 0.05
    assert losses[0.0].item() != losses[0.5].item()
    losses[0.5].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters() if p.requires_grad)


def test_motion_guidance_drops_the_level_with_the_shot(stage_a_data):
    """With decoder.motion_guidance a dropped row trains the null shot at the null level 0 (what CFG's
    unconditional branch then samples with); without it the dropped row keeps its level."""
    cfg: StageAConfig = dataclasses.replace(stage_a_data["cfg"], condition_dropout=1.0)
    dataset, _ = build_dataset(cfg)
    batch = {k: torch.stack([dataset[i][k] for i in range(2)]) for k in dataset[0]}
    torch.manual_seed(0)
    encoder = ActionAwareEncoder.from_config(cfg.encoder)
    decoder = AnimationShotDecoder.from_config(dataclasses.replace(cfg.decoder, motion_guidance=True), with_vae=False)
    with torch.no_grad():
        torch.nn.init.normal_(decoder.transformer.ofs_embedding.linear_2.weight, std=0.5)
    model = train_stage_a.EncoderDecoder(encoder, decoder).eval()

    def by_hand(levels):
        torch.manual_seed(1)  # compute_loss's draws, in its order: dropout, noise, timesteps
        torch.rand(2)
        latents = batch["latents"]
        noise = torch.randn_like(latents)
        t = torch.randint(0, decoder.noise_scheduler.config.num_train_timesteps, (2,))
        noisy = decoder.noise_scheduler.add_noise(latents, noise, t)
        out = decoder(noisy, t, decoder.null_shot_embeds(2), levels)
        return torch.nn.functional.mse_loss(out, decoder.training_target(latents, noise, t))

    with torch.no_grad():
        torch.manual_seed(1)
        guided = train_stage_a.compute_loss(model, model, batch, cfg)
        torch.testing.assert_close(guided, by_hand(torch.zeros(2, dtype=torch.long)))
        decoder.motion_guidance = False
        torch.manual_seed(1)
        plain = train_stage_a.compute_loss(model, model, batch, cfg)
        torch.testing.assert_close(plain, by_hand(batch["motion_level"]))
    assert abs(guided.item() - plain.item()) > 1e-6


def test_malformed_manifest_is_one_clear_error(stage_a_data, tmp_path, capsys):
    manifest = tmp_path / "clips.jsonl"
    lines = (stage_a_data["root"] / "clips.jsonl").read_text().splitlines()
    manifest.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(SystemExit):
        _run(tmp_path / "run", stage_a_data, f"data.manifest={manifest}", "train.max_steps=1")
    assert f"{manifest}:2" in capsys.readouterr().err


def test_a_bad_resume_fails_in_one_line_and_leaves_the_finished_run_alone(stage_a_data, tmp_path, capsys):
    out = _run(tmp_path / "done", stage_a_data, "train.max_steps=1", "warmup_steps=0", "train.checkpoint_every=1")
    kept = {name: (out / name).read_bytes() for name in ("config.yaml", "run_info.json", "metrics.csv")}
    weights = out / "checkpoints" / "step_0000001" / "encoder" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    capsys.readouterr()
    for resume, needle in [("latest", f"{weights}: damaged or truncated"),
                           (str(tmp_path / "nonexistent"), "checkpoint not found")]:
        with pytest.raises(SystemExit) as exit_info:
            _run(out, stage_a_data, "train.max_steps=2", "--resume", resume)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and err.startswith("error: ") and needle in err and "\n" not in err, err
        assert {name: (out / name).read_bytes() for name in kept} == kept


ABLATIONS = {
    "stage_a_random_frame": ("encoder.frame", "random"),
    "stage_a_linear_projector": ("encoder.projector", "linear"),
    "stage_a_fusion_add": ("encoder.fusion", "add"),
    "stage_a_fusion_cross_attn": ("encoder.fusion", "cross_attn"),
    "stage_a_no_motion_scope": ("decoder.motion_scope", False),
    "stage_a_no_warmup": ("warmup_steps", 0),
}


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_ablation_configs_load_and_build(name):
    cfg = load_config(ROOT / "configs" / "ablations" / f"{name}.yaml")
    base = load_config(ROOT / "configs" / "stage_a.yaml")
    key, value = ABLATIONS[name]
    section, _, field = key.rpartition(".")
    assert getattr(getattr(cfg, section) if section else cfg, field) == value
    assert getattr(getattr(base, section) if section else base, field) != value
    assert cfg.output_dir != base.output_dir and cfg.train.max_steps == base.train.max_steps
    with torch.device("meta"):  # paper sizes, no memory
        encoder = ActionAwareEncoder.from_config(cfg.encoder)
        shots = encoder(torch.empty(2, 256, 1280), torch.empty(2, 226, 4096))
    assert shots.shape == (2, 226, 1920)
