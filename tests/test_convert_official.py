"""scripts/convert_official.py on the official reference set: the converted checkpoint's inference.yaml plays a game
through inference_MLLM.py and inference_Decoder.py on CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler

from animegamer.config import InferenceConfig, load_config
from tests.helpers.official_ref_data import REF_DIR, REPO, build_release_tokenizer, mllm_reference

sys.path.insert(0, str(REPO / "scripts"))
import convert_official  # noqa: E402

import inference_Decoder  # noqa: E402
import inference_MLLM  # noqa: E402
from animegamer.game.renderer import DecoderRenderer  # noqa: E402
from animegamer.game.results import load_results  # noqa: E402
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER  # noqa: E402

GAME = "Character: Qiqi; Motion: fly; Background: day sky.\nCharacter: Qiqi; Motion: run; Background: park.\n"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release-side files: the reference set's agent and decoder, YAMLs from its JSON, a tokenizer at the
    release's ids and a tiny random CogVideoX VAE + scheduler with the decoder's latent channels."""
    meta, _ = mllm_reference()
    root = tmp_path_factory.mktemp("release")
    tokenizer = build_release_tokenizer(root / "animegamer_tokenizer", meta["tiny_mistral_config"]["vocab_size"])
    (root / "llm.yaml").write_text(yaml.safe_dump(meta["tiny_llm_yaml"]))
    (root / "agent.yaml").write_text(yaml.safe_dump(meta["tiny_agent_yaml"]))
    args = [
        "--agent-bin", str(REF_DIR / "mllm_agent" / "pytorch_model.bin"),
        "--tokenizer", str(tokenizer),
        "--mistral-config", str(REF_DIR / "mllm_agent" / "tiny_mistral_config.json"),
        "--llm-yaml", str(root / "llm.yaml"),
        "--agent-yaml", str(root / "agent.yaml"),
    ]  # fmt: skip
    decoder_meta = json.loads((REF_DIR / "decoder_ref.json").read_text())
    (root / "decoder.yaml").write_text(yaml.safe_dump(decoder_meta["tiny_model_yaml"]))
    channels = decoder_meta["tiny_model_yaml"]["model"]["network_config"]["params"]["in_channels"]
    torch.manual_seed(0)
    vae = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 16, 16), latent_channels=channels, layers_per_block=1, norm_num_groups=4
    )
    vae.save_pretrained(str(root / "CogVideoX-2b" / "vae"))
    CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER).save_pretrained(str(root / "CogVideoX-2b" / "scheduler"))
    args += ["--decoder-ckpt", str(REF_DIR / "decoder_ckpt"), "--decoder-yaml", str(root / "decoder.yaml")]
    args += ["--cogvideox", str(root / "CogVideoX-2b")]
    return {"root": root, "args": args}


@pytest.fixture(scope="module")
def converted(release):
    out = release["root"] / "converted"
    convert_official.main(["--out", str(out), *release["args"]])
    return out


def test_help_documents_every_input(capsys):
    with pytest.raises(SystemExit) as exit_info:
        convert_official.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--agent-bin", "--tokenizer", "--mistral", "--mistral-config", "--llm-yaml", "--agent-yaml",
                 "--decoder-ckpt", "--decoder-yaml", "--cogvideox", "--out", "--compat", "--history-turns"):
        assert flag in text


def test_converted_checkpoint_plays(converted, tmp_path):
    names = {p.name for p in converted.iterdir()}
    assert {"Mistral", "mllm", "inference.yaml", "conversion.json"} <= names
    config = yaml.safe_load((converted / "inference.yaml").read_text())
    meta, _ = mllm_reference()
    assert "lora_rank" not in config["mllm"] and "lora_rank" not in config["decoder"]  # the files say the shapes
    loaded = load_config(converted / "inference.yaml", schema=InferenceConfig)
    assert loaded.mllm.lora_rank == meta["tiny_llm_yaml"]["peft_config"]["r"]
    assert loaded.mllm.vocabulary == "released" and loaded.mllm.resampler_gelu == "erf" and config["compat"] == "fixed"
    game = tmp_path / "game.txt"
    game.write_text(GAME)
    results = tmp_path / "game"
    overrides = [f"game={game}", f"output_dir={results}", "mllm.dtype=fp32", "device=cpu"]
    inference_MLLM.main(["--config", str(converted / "inference.yaml"), *overrides])
    summary, turns = load_results(results)
    resampler = meta["tiny_agent_yaml"]["output_resampler"]
    assert summary["complete"] and len(turns) == 2
    assert all(shot.shape == (resampler["num_queries"], resampler["output_dim"]) for _, shot in turns)
    assert all(torch.isfinite(shot).all() for _, shot in turns)
    inference_Decoder.main(
        ["--config", str(converted / "inference.yaml"), f"output_dir={results}", "device=cpu",
         "sampling.steps=2", "decoder.dtype=fp32"]
    )  # fmt: skip
    assert (results / "turn_000.mp4").is_file() and (results / "turn_001.mp4").is_file()


@pytest.mark.slow
def test_released_compat_plays(converted, tmp_path, monkeypatch):
    game = tmp_path / "game.txt"
    game.write_text(GAME.splitlines()[0] + "\n")
    results = tmp_path / "game"
    inference_MLLM.main(
        ["--config", str(converted / "inference.yaml"), f"game={game}", f"output_dir={results}", "mllm.dtype=fp32",
         "device=cpu", "compat=released"]
    )  # fmt: skip
    _, turns = load_results(results)
    state = json.loads((results / "turn_000" / "state.json").read_text())
    assert len(turns) == 1 and len(state["release_values"]) == 4
    # The release's decoder renders the level as parsed, through its table: a random agent's failed parse (ML 0)
    # goes to the table's last row (flow 40), where our clamped value would say level 1 (flow 0.5).
    levels, sample = [], DecoderRenderer.latents

    def recording_latents(self, shot_embeds, motion_level, seed, *args, **kwargs):
        levels.append(motion_level)
        return sample(self, shot_embeds, motion_level, seed, *args, **kwargs)

    monkeypatch.setattr(DecoderRenderer, "latents", recording_latents)
    inference_Decoder.main(
        ["--config", str(converted / "inference.yaml"), f"output_dir={results}", "device=cpu", "compat=released",
         "sampling.steps=2", "decoder.dtype=fp32"]
    )  # fmt: skip
    expected = state["release_values"][0] if 1 <= state["release_values"][0] <= 4 else 5
    assert levels == [expected] and (results / "turn_000.mp4").is_file()


def test_the_release_plays_only_through_its_door(converted, tmp_path):
    """compat=released: the core's game refuses it in one line; animegamer.official.game builds the release's own
    predictor (the core's runner with its turn, history_turns = max_window - 1) and renderer (its sampler and fp16
    transformer), and a turn plays and renders to the VAE's frame count of the converted latent frames."""
    from animegamer.config import InferenceConfig, load_config
    from animegamer.game import build as session
    from animegamer.official import game
    from animegamer.official.agent import predict_released

    overrides = ["device=cpu", "compat=released", "mllm.dtype=fp32", "sampling.steps=2", f"output_dir={tmp_path}"]
    cfg = load_config(converted / "inference.yaml", overrides, schema=InferenceConfig)
    with pytest.raises(ValueError, match="compat=released: the release's own predictor"):
        session.build_session(cfg)
    for bad in ("sampling.preset=distilled", "sampling.cache=first_block"):
        with pytest.raises(ValueError, match="compat=released"):
            game.check_released_options(load_config(converted / "inference.yaml", [*overrides, bad],
                                                    schema=InferenceConfig))
    played = game.build_session(cfg)
    parts = played.game
    assert parts.predictor.predict is predict_released and played.history_turns == cfg.history_turns == 0
    assert isinstance(parts.renderer.sampler, game.ReleasedSampler)
    assert parts.renderer.decoder.dtype == torch.float16
    turn = played.play(GAME.splitlines()[0])
    latent_frames = json.loads((converted / "conversion.json").read_text())["decoder"]["sizes"]["latent_frames"]
    frames = parts.renderer.render(turn.shot_embeds, turn.values.motion_level, 0)
    assert frames.shape == (game.vae_frames(latent_frames), cfg.sampling.height, cfg.sampling.width, 3)
    fixed = game.build_session(load_config(converted / "inference.yaml", overrides[:1] + overrides[2:],
                                           schema=InferenceConfig), render=False)
    assert fixed.game.predictor.predict is not predict_released


@pytest.mark.slow
def test_the_terminal_game_plays_the_release(converted, tmp_path, monkeypatch, capsys):
    """``python -m animegamer.play ... compat=released``: the terminal command plays a turn with the release's own
    predictor and renderer (its turn records the values as the release parsed them), as the other entry points do."""
    import io

    from animegamer import play
    from animegamer.official import game

    calls = []
    real = game.predict_released

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(game, "predict_released", counted)
    monkeypatch.setattr(sys, "stdin", io.StringIO(GAME.splitlines()[0] + "\n:quit\n"))
    play.main(["--config", str(converted / "inference.yaml"), "device=cpu", "compat=released", "mllm.dtype=fp32",
               "sampling.steps=2", "decoder.dtype=fp32", f"output_dir={tmp_path}"])
    out = capsys.readouterr().out
    games = list(tmp_path.glob("play_*"))
    assert len(calls) == 1 and len(games) == 1, out
    assert (games[0] / "turn_000.mp4").is_file() and (games[0] / "game.save").is_file(), out


def _fails(args, capsys, match):
    with pytest.raises(SystemExit) as exit_info:
        convert_official.main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and match in err


def test_bad_inputs_exit_2_and_write_nothing(release, converted, tmp_path, capsys):
    out = tmp_path / "out"
    _fails(["--out", str(out)], capsys, "nothing to convert")
    hostile = tmp_path / "pytorch_model.bin"
    torch.save({"w": Path("/etc/passwd")}, hostile)  # a pickle that needs a global other than tensors
    args = list(release["args"])
    args[args.index("--agent-bin") + 1] = str(hostile)
    _fails(["--out", str(out), *args], capsys, "refused")
    missing = list(release["args"])
    missing[missing.index("--tokenizer") + 1] = str(tmp_path / "no_tokenizer")
    _fails(["--out", str(out), *missing], capsys, "tokenizer directory not found")
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    _fails(["--out", str(converted), *release["args"]], capsys, "not an empty directory")


@pytest.mark.parametrize("target", ["empty dir", "full dir", "file", "dangling", "loop"])
def test_out_naming_a_symlink_is_refused_and_the_link_kept(tmp_path, capsys, target):
    """Publishing is a rename: into a link's place it would replace the link (and leave a stray temp link)."""
    real = tmp_path / "real"
    if target in ("empty dir", "full dir"):
        real.mkdir()
        if target == "full dir":
            (real / "notes.txt").write_text("mine")
    elif target == "file":
        real.write_text("mine")
    link = tmp_path / "out"
    link.symlink_to(link if target == "loop" else real)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ["--out", str(link), "--agent-bin", str(tmp_path / "agent.bin"), "--tokenizer", str(tmp_path),
            "--mistral-config", str(tmp_path / "config.json")]
    _fails(args, capsys, "is a symbolic link")
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == before  # no stray temp link
    if target == "empty dir":
        assert list(real.iterdir()) == []


def test_a_hostile_agent_file_is_refused_without_pytorchs_advice(release, tmp_path, capsys):
    hostile = tmp_path / "pytorch_model.bin"
    torch.save({"w": Path("/etc/passwd")}, hostile)
    args = list(release["args"])
    args[args.index("--agent-bin") + 1] = str(hostile)
    with pytest.raises(SystemExit):
        convert_official.main(["--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert "refused" in err and "PosixPath" in err and "weights_only" not in err and "False" not in err
