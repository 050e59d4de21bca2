"""Stage (e): the small causal decoder trained on a tiny VAE's latents of real clips: a real run, resume, errors."""

import json
from pathlib import Path

import pytest
import torch

from animegamer.config import load_config
from animegamer.data.features import META_FILE, fit_frames
from animegamer.data.manifest import ClipRecord, write_manifest
from animegamer.data.tensor_store import TensorStore
from animegamer.data.video import read_video, write_mp4
from animegamer.models.causal_decoder import CausalLatentDecoder
from animegamer.models.vae import load_vae, vae_encode
from animegamer.models.weights import load_state_dict_file
from animegamer.recipes import stage_e as train_stage_e
from animegamer.training.checkpoint import list_checkpoints
from tests.helpers.clips import make_clip_frames
from tests.helpers.stage_scripts import (
    ROOT,
    check_bad_resumes_leave_the_run_alone,
    launch_two_processes,
    logged_losses,
    tiny_decoder_config,
)

TINY_CONFIG = ROOT / "configs" / "tiny" / "stage_e.yaml"
TAGS = "<S>Qiqi</S><MD>walk</MD><EV>park</EV><ML>2</ML><MA>slowly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>"
pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_cogvideox_dir):
    """Six clips of two films with the tiny VAE's latents (9 frames of 48x64 -> 3 latent frames of 6x8); one clip's
    latents are missing (left out)."""
    root = tmp_path_factory.mktemp("stage_e")
    vae = load_vae(tiny_decoder_config(tiny_cogvideox_dir))
    records, latents = [], {}
    for i in range(6):
        film, index = f"film{i // 3}", i % 3
        frames = make_clip_frames(9, 48, 64, speed=1 + i, seed=i)
        write_mp4(root / f"clips/c{i}.mp4", frames, fps=8)
        clip_id = f"{film}_{index:05d}"
        records.append(ClipRecord(clip_id, f"clips/c{i}.mp4", film, index, 2.0 * index, 2.0 * index + 2, tags=TAGS))
        if i != 2:
            fitted = fit_frames(read_video(root / f"clips/c{i}.mp4", fps=8)[0], 9, 48, 64)  # as stored: from the mp4
            latents[clip_id] = {"latents": vae_encode(vae, fitted[None])[0].permute(1, 0, 2, 3).contiguous()}
    write_manifest(root / "clips.jsonl", records)
    TensorStore(root / "features").write_shard(latents)
    compare = {"height": 48, "width": 64, "num_frames": 9, "fps": 8}
    (root / "features" / META_FILE).write_text(json.dumps({"compare": compare, "paths": {}}))
    overrides = [
        f"vae={tiny_cogvideox_dir}",
        f"data.manifest={root / 'clips.jsonl'}",
        f"data.features_dir={root / 'features'}",
        "data.height=48",
        "data.width=64",
        "data.num_frames=9",
        "data.split=all",
        "train.log_every=1",
        "crop_size=4",
    ]
    return {"root": root, "overrides": overrides}


def _argv(run, out: Path, *extra: str) -> list[str]:
    return ["--config", str(TINY_CONFIG), *run["overrides"], f"output_dir={out}", *extra]


def test_loss_falls_and_the_checkpoint_is_a_small_decoder(run, tmp_path):
    out = train_stage_e.main(_argv(run, tmp_path / "fit", "train.max_steps=30", "train.checkpoint_every=30",
                                   "train.batch_size=5"))
    losses = logged_losses(out)
    assert len(losses) == 30 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses
    step = list_checkpoints(out)[-1]
    model = CausalLatentDecoder.from_pretrained(step / "small_decoder")
    assert model.config == {"latent_channels": 4, "spatial_factor": 8, "temporal_factor": 4, "channels": [16, 16, 8],
                            "blocks_per_level": 1}
    assert model.decode(torch.randn(1, 3, 4, 6, 8)).shape == (1, 9, 3, 48, 64)  # whole frames, not crops
    left_out = (out / "left_out.txt").read_text()
    assert "film0_00002" in left_out and "no precomputed latents" in left_out


def test_resume_is_exact(run, tmp_path, capsys):
    common = ["train.checkpoint_every=1", "train.keep_checkpoints=10"]
    straight = train_stage_e.main(_argv(run, tmp_path / "a", *common, "train.max_steps=3"))
    assert [p.name for p in list_checkpoints(straight)] == ["step_0000001", "step_0000002", "step_0000003"]
    train_stage_e.main(_argv(run, tmp_path / "b", *common, "train.max_steps=2"))
    resumed = train_stage_e.main(_argv(run, tmp_path / "b", *common, "train.max_steps=3", "--resume", "latest"))
    assert "resumed from" in capsys.readouterr().out
    final = load_state_dict_file(list_checkpoints(straight)[-1] / "small_decoder" / "model.safetensors")
    again = load_state_dict_file(list_checkpoints(resumed)[-1] / "small_decoder" / "model.safetensors")
    assert final.keys() == again.keys()
    for k, v in final.items():
        torch.testing.assert_close(again[k], v, rtol=0, atol=1e-6, msg=k)
    assert logged_losses(resumed) == pytest.approx(logged_losses(straight), abs=1e-6)


def test_user_mistakes_exit_2_with_one_line(run, tmp_path, capsys):
    cases = {
        "data.height=64": "other clip settings",
        f"vae={tmp_path / 'nowhere'}": "VAE config not found",
        "crop_size=-1": "crop_size=-1",
        "small_decoder.channels=[8,8]": "one width per",
    }
    for override, message in cases.items():
        with pytest.raises(SystemExit) as exc:
            train_stage_e.main(_argv(run, tmp_path / "bad", override))
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and err[-1].startswith("error: ") and message in err[-1], (override, err)
    assert not (tmp_path / "bad").exists()  # nothing written before the checks pass
    with pytest.raises(SystemExit) as exc:
        train_stage_e.main(["--help"])
    assert exc.value.code == 0 and "crop_size" in capsys.readouterr().out


def test_without_a_store_the_vae_encodes_the_clips_first(run, tmp_path, capsys, tiny_cogvideox_dir):
    store_dir = tmp_path / "latents"
    out = train_stage_e.main(_argv(run, tmp_path / "own", f"data.features_dir={store_dir}", "train.max_steps=1"))
    assert "latents: 6 clips encoded" in capsys.readouterr().out
    ours, theirs = TensorStore(store_dir), TensorStore(run["root"] / "features")
    assert len(ours) == 6 and "film0_00002" in ours  # the clip the fixture's store lacks
    for clip_id in theirs.clip_ids():  # encoded in a batch there, one by one here: float rounding apart
        torch.testing.assert_close(ours.load(clip_id)["latents"], theirs.load(clip_id)["latents"], rtol=0, atol=1e-3)
    assert json.loads((store_dir / META_FILE).read_text())["latents_only"] is True
    assert not (out / "left_out.txt").exists()
    train_stage_e.main(_argv(run, tmp_path / "own", f"data.features_dir={store_dir}", "train.max_steps=2",
                             "--resume", "latest"))
    assert "encoded" not in capsys.readouterr().out  # nothing left to encode
    with pytest.raises(SystemExit) as exc:  # a store of other clip settings is refused, not topped up
        train_stage_e.main(_argv(run, tmp_path / "own2", f"data.features_dir={store_dir}", "data.height=64"))
    assert exc.value.code == 2 and "other clip settings" in capsys.readouterr().err


def test_a_bad_resume_fails_in_one_line_and_leaves_the_finished_run_alone(run, tmp_path, capsys):
    out = train_stage_e.main(_argv(run, tmp_path / "done", "train.max_steps=1", "train.checkpoint_every=1"))
    check_bad_resumes_leave_the_run_alone(train_stage_e.main, lambda *extra: _argv(run, out, *extra), out, capsys)


def test_two_processes(run, tmp_path):
    """The same script under accelerate with 2 CPU processes (DDP): one run, every rank's RNG state saved."""
    out = tmp_path / "ddp"
    result = launch_two_processes(
        "train_stage_e", _argv(run, out, "train.max_steps=2", "train.batch_size=1", "train.checkpoint_every=2")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "run_info.json").read_text())["num_processes"] == 2
    step = out / "checkpoints" / "step_0000002"
    assert (step / "random_states_1.pkl").is_file() and (step / "small_decoder" / "model.safetensors").is_file()
    assert all(torch.isfinite(torch.tensor(logged_losses(out))))


def test_configs():
    full, tiny = load_config(ROOT / "configs" / "stage_e.yaml"), load_config(TINY_CONFIG)
    assert full.vae == "checkpoints/CogVideoX-2b" and full.small_decoder.channels == [256, 128, 64]
    assert CausalLatentDecoder(16, 8, 4, tuple(full.small_decoder.channels), full.small_decoder.blocks_per_level)
    assert tiny.data.features_dir == load_config(ROOT / "configs" / "tiny" / "stage_a.yaml").data.features_dir
