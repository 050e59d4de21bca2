"""The converted official decoder against the official code's own outputs (tests/data/official_ref).

The reference directory comes from ``ANIMEGAMER_OFFICIAL_REF`` when set: every size, seed, step count, flow value
and timestep is read from its JSON and tensors, so the same tests check any reference set of this layout.
Conversion -> our loading path (load_decoder) -> forward cases, the release sampler from the recorded noise,
schedules, eps; then malformed / hostile checkpoints, and random SAT checkpoints of other sizes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file

from animegamer.config import DecoderConfig, SamplingConfig
from animegamer.models.trained import load_decoder
from animegamer.models.vae import DTYPES
from animegamer.official.decoder import convert_decoder
from animegamer.official.game import ReleasedSampler, cast_transformer, release_sampler_settings, vae_frames
from animegamer.official.release_io import ReleaseFileError
from animegamer.official.sampler import (
    RELEASED,
    denoise,
    denoiser_table,
    dynamic_cfg_scale,
    sample_released,
    sampler_schedule,
    snap_to_table,
)
from animegamer.sampling.denoise import sample
from tests.helpers.pickle_trap import PickleTrap

REF = Path(os.environ.get("ANIMEGAMER_OFFICIAL_REF", Path(__file__).parent / "data" / "official_ref"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def ref():
    meta = json.loads((REF / "decoder_ref.json").read_text())
    return meta, load_file(str(REF / "decoder_ref.safetensors"))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, ref):
    """A diffusers CogVideoX-2b look-alike for vae/ + scheduler/: a tiny random VAE with the set's latent channels."""
    return _write_base(tmp_path_factory.mktemp("cogvideox_base"), ref[0]["derived"]["latent_c"])


def _write_base(out: Path, channels: int) -> Path:
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler

    from animegamer.tiny import COGVIDEOX_2B_SCHEDULER

    torch.manual_seed(0)
    vae = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 16, 16), latent_channels=channels, layers_per_block=1, norm_num_groups=4
    )
    vae.save_pretrained(str(out / "vae"))
    CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER).save_pretrained(str(out / "scheduler"))
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory, ref, base_dir):
    out = tmp_path_factory.mktemp("converted")
    (out / "model.yaml").write_text(yaml.safe_dump(ref[0]["tiny_model_yaml"]))
    summary = convert_decoder(REF / "decoder_ckpt", out / "ckpt", model_yaml=out / "model.yaml", base_dir=base_dir)
    return out / "ckpt", summary


@pytest.fixture(scope="module")
def decoder(converted):
    ckpt, summary = converted
    cfg = DecoderConfig(**summary["decoder_config"], dtype="fp32", gradient_checkpointing=False)
    return load_decoder(summary["decoder_checkpoint"], cfg, with_vae=False)


@pytest.fixture(scope="module")
def settings(converted) -> dict:
    """The release sampler's settings the converted decoder records."""
    return release_sampler_settings(converted[1]["decoder_checkpoint"])


def _forward_case(decoder, settings, ref, case):
    """Our CFG forward of one reference case; returns what the reference records."""
    meta, t = ref
    tag = case["tag"]
    x, s_a = t[f"fwd_{tag}.x"], t["s_a"]
    captured = {}
    tr = decoder.transformer
    def keep(name, value):
        captured.setdefault(name, value)  # the first call is the forward under test (denoise runs it again)

    hooks = [
        tr.patch_embed.register_forward_hook(lambda m, a, o: keep("embed", o)),
        tr.norm_out.register_forward_pre_hook(lambda m, a, k: keep("emb", k["temb"]), with_kwargs=True),
    ]
    try:
        shots2 = torch.cat([decoder.null_shot_embeds(1), s_a])
        model_in = torch.cat([x, x])
        flow = torch.full((2,), case["flow_value"])
        with torch.no_grad():
            dit_out = decoder(model_in, torch.full((2,), float(case["timestep_idx"])), shots2, motion_value=flow)
            table = denoiser_table(settings)
            rows = denoise(decoder, x, case["timestep_idx"], case["alpha_cumprod_sqrt"], shots2, flow, table, RELEASED)
    finally:
        for h in hooks:
            h.remove()
    steps = len(t["schedule50.timesteps"]) if "schedule50.timesteps" in t else settings["steps"]
    w = dynamic_cfg_scale(case["timestep_idx"], steps, settings["guidance_scale"],
                          settings["guidance_exponent"])
    uncond, cond = rows.chunk(2)
    embed = captured["embed"] - tr.patch_embed.pos_embedding[:, : captured["embed"].shape[1]]
    return {"embed_tokens": embed, "time_flow_emb": captured["emb"], "dit_out": dit_out, "denoised": rows,
            "cfg_denoised": uncond + w * (cond - uncond), "w": w}


def test_conversion_writes_both_parts(converted, ref):
    ckpt, summary = converted
    meta = ref[0]
    assert summary["tensors_converted"] == len(meta["state_dict"])
    assert summary["lora_scale"] == pytest.approx(meta["derived"]["lora_scaling"])
    assert sorted(p.name for p in (ckpt / "CogVideoX").iterdir()) == ["scheduler", "transformer", "vae"]
    assert sorted(p.name for p in (ckpt / "decoder").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "decoder_config.json", "motion_embedding.safetensors",
        "null_shot_embeds.safetensors",
    ]
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".")]  # no temp dir left
    config = json.loads((ckpt / "CogVideoX" / "transformer" / "config.json").read_text())
    assert config["num_layers"] == meta["tiny_model_yaml"]["model"]["network_config"]["params"]["num_layers"]


@pytest.mark.parametrize("index", [0, 1])
def test_forward_cases_match_the_official_code(decoder, settings, ref, index):
    meta, t = ref
    if index >= len(meta["forward_cases"]):
        pytest.skip("this reference set has fewer forward cases")
    case = meta["forward_cases"][index]
    ours = _forward_case(decoder, settings, ref, case)
    tag = case["tag"]
    cond_tokens = ours["embed_tokens"].shape[1] - t[f"fwd_{tag}.embed_tokens"].shape[1]
    assert cond_tokens == 0
    assert torch.equal(ours["embed_tokens"][1, : t["s_a"].shape[1]], t["s_a"][0])  # the cond row is s_a exactly
    for key in ("embed_tokens", "time_flow_emb", "dit_out", "denoised", "cfg_denoised"):
        assert rel(ours[key], t[f"fwd_{tag}.{key}"]) < 1e-5, key
    assert ours["w"] == pytest.approx(case["dynamic_cfg_scale"], rel=1e-7)
    table = denoiser_table(settings)
    assert float(snap_to_table(case["alpha_cumprod_sqrt"], table)) == pytest.approx(
        case["alpha_quantised_by_denoiser"], abs=1e-7
    )


def _sample_run(ref):
    """(steps, prefix) of the recorded full sampler run, found by name (sample_<N>step)."""
    meta, t = ref
    names = {m.group(1) for k in t for m in [re.match(r"sample_(\d+)step\.", k)] if m}
    assert len(names) == 1, names
    steps = int(names.pop())
    return steps, f"sample_{steps}step"


def test_schedules_match_the_official_discretization(settings, ref):
    meta, t = ref
    found = sorted(int(m.group(1)) for k in t for m in [re.match(r"schedule(\d+)\.alpha_cumprod_sqrt$", k)] if m)
    assert found
    for n in found:
        alphas, timesteps = sampler_schedule(n, settings)
        assert torch.equal(timesteps, t[f"schedule{n}.timesteps"])
        torch.testing.assert_close(alphas, t[f"schedule{n}.alpha_cumprod_sqrt"], rtol=0, atol=2e-7)
    steps, prefix = _sample_run(ref)
    run = meta[prefix]
    table = denoiser_table(settings)
    alphas, timesteps = sampler_schedule(steps, settings)
    assert timesteps.flip(0).tolist() == run["timesteps_per_step"]
    for i, (position, w) in enumerate(run["dynamic_cfg_step_index_and_scale_per_step"]):
        t_i = run["timesteps_per_step"][i]
        assert position == steps - t_i  # the release's DynamicCFG reads the raw timestep
        assert dynamic_cfg_scale(t_i, steps, settings["guidance_scale"], settings["guidance_exponent"]) == (
            pytest.approx(w, rel=1e-9)
        )
        assert float(alphas[i]) == pytest.approx(run["alpha_cumprod_sqrt_per_step"][i], abs=1e-7)
        q = float(snap_to_table(alphas[i], table))
        assert q == pytest.approx(run["alpha_quantised_by_denoiser_per_step"][i], abs=1e-7)


def test_release_sampler_reproduces_the_official_run(decoder, settings, ref):
    meta, t = ref
    steps, prefix = _sample_run(ref)
    run = meta[prefix]
    init = t[f"{prefix}.init_noise"]
    noises = t[f"{prefix}.step_noises"]
    trace, draws = {}, iter(noises)
    samples = sample_released(
        decoder, t["s_a"], torch.tensor([float(run["flow_value"])]), tuple(init.shape[1:]), settings, steps,
        settings["guidance_scale"], settings["guidance_exponent"], noises=draws, init_noise=init, trace=trace,
    )
    assert next(draws, None) is None  # every recorded draw used, in order (the discarded ones included)
    assert len(trace["x_in"]) == steps
    for i in range(steps):
        assert rel(trace["x_in"][i], t[f"{prefix}.x_in_per_step"][i]) < 1e-4, i
        assert rel(trace["denoised"][i], t[f"{prefix}.denoised_per_step"][i]) < 1e-4, i
    assert rel(samples, t[f"{prefix}.samples"]) < 5e-5


@pytest.fixture
def fresh_decoder(converted):
    """A converted decoder of its own (with the VAE), for tests that change its dtype or merge its LoRA."""
    ckpt, summary = converted
    cfg = DecoderConfig(**summary["decoder_config"], dtype="fp32", gradient_checkpointing=False)
    return load_decoder(summary["decoder_checkpoint"], cfg)


def _clip_sampling(summary, **kw) -> SamplingConfig:
    s = summary["sampling"]
    base = dict(steps=3, height=s["height"], width=s["width"], num_frames=s["num_frames"], seed=7)
    return SamplingConfig(**{**base, **kw})


def _released(decoder, summary, sampling):
    """The converted decoder as the release runs it: its whole transformer in the release's dtype, its sampler."""
    settings = release_sampler_settings(summary["decoder_checkpoint"])
    cast_transformer(decoder, DTYPES[settings["dtype"]])
    return ReleasedSampler(decoder, sampling, settings)


@pytest.mark.slow
def test_released_compat_samples_with_the_release_sampler(fresh_decoder, converted, ref):
    _, summary = converted
    meta, t = ref
    decoder = fresh_decoder
    assert decoder.motion_values == [0.5, 2.5, 10.0, 15.0, 40.0]  # inference_Decoder.py's level -> flow table
    sampling = _clip_sampling(summary)
    level = torch.tensor([4])
    fixed = sample(decoder, t["s_a"], level, sampling, decode=False)
    sampler = _released(decoder, summary, sampling)
    assert decoder.dtype == torch.float16  # the release's fp16 decoder
    assert {p.dtype for p in decoder.transformer.parameters()} == {torch.float16}  # LoRA and motion embedding too
    steps_seen = []
    released = sampler.latents(t["s_a"], level, torch.Generator().manual_seed(7),
                               on_step=lambda *a: steps_seen.append(a))
    assert steps_seen == [(i, sampling.steps) for i in range(1, sampling.steps + 1)]  # the games' progress line
    expected = sample_released(
        decoder, t["s_a"], torch.tensor([15.0]), tuple(released.shape[1:]), sampler.settings, sampling.steps,
        sampling.guidance_scale, sampling.dynamic_cfg_exponent, generator=torch.Generator().manual_seed(7),
    )
    assert torch.equal(released, expected)  # the level went through the table, the seed through the generator
    assert torch.isfinite(released).all() and rel(fixed, released) > 1e-2  # two different samplers
    # a batch with one generator per clip: each clip as it samples alone (the release draws a batch from one)
    pair = sampler.latents(torch.cat([t["s_a"], t["s_a"]]), torch.tensor([4, 2]),
                           [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)])
    assert torch.equal(pair[:1], released)
    with pytest.raises(ValueError, match="motion levels"):
        sampler.latents(t["s_a"], torch.tensor([0]), torch.Generator())


def test_released_clip_has_the_frames_of_the_sets_latent_count(fresh_decoder, converted, ref):
    """Sizes from the set: its latent frame count (the release's sampling_num_frames) is what the converted decoder
    samples, and a clip decodes to what CogVideoX's causal VAE makes of that many latent frames."""
    _, summary = converted
    meta, t = ref
    latent_frames = meta["derived"]["latent_frames"]
    assert latent_frames == meta["tiny_inference_yaml"]["args"]["sampling_num_frames"]
    _, prefix = _sample_run(ref)
    assert t[f"{prefix}.init_noise"].shape[1] == latent_frames
    assert summary["sizes"]["latent_frames"] == latent_frames
    sampling = _clip_sampling(summary, steps=2)
    sampler = _released(fresh_decoder, summary, sampling)
    latents = sampler.latents(t["s_a"], torch.tensor([3]), torch.Generator().manual_seed(1))
    assert latents.shape[1] == latent_frames
    frames = fresh_decoder.decode_latents(latents)
    assert frames.shape == (1, vae_frames(latent_frames), sampling.height, sampling.width, 3)


@pytest.mark.parametrize("latent_frames", [1, 2, 3, 4, 5])
def test_vae_frames_is_what_the_causal_vae_decodes(fresh_decoder, latent_frames):
    """The frame count rule against the real (tiny) CogVideoX VAE: an odd count keeps its first frame single."""
    latents = torch.zeros(1, latent_frames, fresh_decoder.vae.config.latent_channels, 2, 2)
    assert fresh_decoder.decode_latents(latents).shape[1] == vae_frames(latent_frames)
    assert [vae_frames(f) for f in (1, 2, 3, 5)] == [1, 8, 9, 17]  # 17 frames <- 5 latent frames: the release's


def test_core_decoder_keeps_no_release_state(converted, tmp_path):
    """The converted decoder's sampler settings stay in its checkpoint: the core decoder neither holds nor samples
    with them, and the release's renderer needs them (a decoder of our own is refused in one line)."""
    _, summary = converted
    cfg = DecoderConfig(**summary["decoder_config"], dtype="fp32", gradient_checkpointing=False)
    decoder = load_decoder(summary["decoder_checkpoint"], cfg, with_vae=False)
    assert not [name for name in vars(decoder) if "release" in name or "compat" in name]
    assert not hasattr(decoder, "use_compat")
    settings = release_sampler_settings(summary["decoder_checkpoint"])
    assert settings["dtype"] == "fp16"  # the release's inference.yaml: fp16 True
    assert {"num_idx", "shift_scale", "linear_start", "linear_end", "steps", "guidance_scale"} <= set(settings)
    own = tmp_path / "decoder"
    shutil.copytree(Path(summary["decoder_checkpoint"]) / "decoder", own)
    saved = json.loads((own / "decoder_config.json").read_text())
    del saved["release_sampler"]
    (own / "decoder_config.json").write_text(json.dumps(saved))  # as save_trained writes a decoder of our own
    with pytest.raises(ValueError, match="no release_sampler settings"):
        release_sampler_settings(own)


def test_merged_lora_samples_like_unmerged(fresh_decoder, converted, ref):
    _, summary = converted
    s_a = ref[1]["s_a"]
    sampling = _clip_sampling(summary, guidance_steps_fraction=0.67)
    plain = sample(fresh_decoder, s_a, torch.tensor([2]), sampling, decode=False)
    fresh_decoder.merge_lora()
    merged = sample(fresh_decoder, s_a, torch.tensor([2]), sampling, decode=False)
    assert rel(merged, plain) < 1e-5
    fresh_decoder.unmerge_lora()
    fresh_decoder.transformer.disable_adapters()  # the LoRA matters: without it the clip changes
    assert rel(sample(fresh_decoder, s_a, torch.tensor([2]), sampling, decode=False), plain) > 1e-3


def test_layernorm_eps_follow_the_release(decoder, ref):
    """B11: eps is invisible at unit scale, so the final norm is checked on low-variance input, then every eps."""
    from animegamer.official.release_io import load_release_pickle

    meta, _ = ref
    eps = meta["layernorm_eps_by_module"]
    latest = (REF / "decoder_ckpt" / "latest").read_text().strip()
    module = load_release_pickle(REF / "decoder_ckpt" / latest / "mp_rank_00_model_states.pt")["module"]
    name = "mixins.final_layer.norm_final"
    weight, bias = (module[f"model.diffusion_model.{name}.{p}"] for p in ("weight", "bias"))
    x = 1 + 1e-3 * torch.randn(4, weight.shape[0], generator=torch.Generator().manual_seed(0))  # variance ~1e-6
    tr = decoder.transformer
    with torch.no_grad():
        ours = tr.norm_out.norm(x)
    expected = torch.nn.functional.layer_norm(x, weight.shape, weight, bias, eps[name])
    wrong = torch.nn.functional.layer_norm(x, weight.shape, weight, bias, tr.config.norm_eps)
    assert rel(ours, expected) < 1e-5 and rel(wrong, expected) > 1e-2  # the input resolves the eps
    assert tr.norm_final.eps == eps["transformer.final_layernorm"]
    for i, block in enumerate(tr.transformer_blocks):
        assert block.norm1.norm.eps == eps[f"transformer.layers.{i}.input_layernorm"]
        assert block.norm2.norm.eps == eps[f"transformer.layers.{i}.post_attention_layernorm"]
        assert block.attn1.norm_q.eps == eps[f"mixins.adaln_layer.query_layernorm_list.{i}"]
        assert block.attn1.norm_k.eps == eps[f"mixins.adaln_layer.key_layernorm_list.{i}"]


def _copy_ckpt(tmp_path) -> tuple[Path, Path, dict]:
    src = REF / "decoder_ckpt"
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    latest = (dst / "latest").read_text().strip()
    pt = dst / latest / "mp_rank_00_model_states.pt"
    return dst, pt, torch.load(pt, weights_only=True)


def _damage(kind: str, pt: Path, obj: dict, ckpt: Path, marker: Path) -> str:
    module = obj["module"]
    key = sorted(module)[-1]
    if kind == "no_latest":
        (ckpt / "latest").unlink()
        return "latest"
    if kind == "missing_key":
        del module[key]
        torch.save(obj, pt)
        return "missing"
    if kind == "wrong_shape":
        module[key] = torch.zeros(*module[key].shape, 2)
        torch.save(obj, pt)
        return re.escape(key)
    if kind == "not_sat":
        torch.save(module, pt)  # a bare state dict, no 'module'
        return "module"
    torch.save({**obj, "payload": PickleTrap(marker)}, pt)
    return "refused"


@pytest.mark.parametrize("kind", ["no_latest", "missing_key", "wrong_shape", "not_sat", "hostile"])
def test_bad_checkpoints_are_refused_and_nothing_is_written(tmp_path, ref, kind):
    ckpt, pt, obj = _copy_ckpt(tmp_path)
    marker = tmp_path / "pwned"
    match = _damage(kind, pt, obj, ckpt, marker)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(ref[0]["tiny_model_yaml"]))
    out = tmp_path / "out"
    with pytest.raises(ReleaseFileError, match=match) as err:
        convert_decoder(ckpt, out, model_yaml=tmp_path / "model.yaml")
    assert "\n" not in str(err.value) and str(ckpt) in str(err.value)
    assert not out.exists() and not marker.exists()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_position_table_stored_in_half_precision_passes_a_wrong_one_is_refused(tmp_path, ref, dtype):
    """A half-precision release stores the sin-cos table rounded (max abs error 2.4e-4 in fp16 at 2B's sizes);
    that is the table, while one of another grid order is not."""
    from animegamer.official.decoder import check_position_table
    from animegamer.official.release_files import position_table
    from animegamer.official.sat_layout import read_model_yaml

    (tmp_path / "model.yaml").write_text(yaml.safe_dump(ref[0]["tiny_model_yaml"]))
    spec = read_model_yaml(tmp_path / "model.yaml")
    table = position_table(spec)
    key = "mixins.pos_embed.pos_embedding"
    diff = check_position_table({key: table.to(dtype)}, spec, tmp_path / "ckpt.pt")
    assert 0 < diff <= torch.finfo(dtype).eps / 2
    assert check_position_table({key: table}, spec, tmp_path / "ckpt.pt") < 1e-6
    video = table[:, spec.text_length:]
    swapped = torch.cat([table[:, : spec.text_length], video.flip(1)], dim=1)  # the grid read backwards
    with pytest.raises(ReleaseFileError, match="position table differs"):
        check_position_table({key: swapped.to(dtype)}, spec, tmp_path / "ckpt.pt")


def test_yaml_that_disagrees_with_the_checkpoint_is_refused(tmp_path, ref):
    tree = json.loads(json.dumps(ref[0]["tiny_model_yaml"]))
    tree["model"]["network_config"]["params"]["modules"]["lora_config"]["params"]["r"] += 1
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(tree))
    with pytest.raises(ReleaseFileError, match="matrix_A"):
        convert_decoder(REF / "decoder_ckpt", tmp_path / "out", model_yaml=tmp_path / "model.yaml")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "sizes",
    [
        dict(hidden_size=48, num_attention_heads=3, num_layers=2, time_embed_dim=24, num_frames=5, latent_height=4,
             latent_width=6, in_channels=8, out_channels=8, text_hidden_size=12, r=4, lora_alpha=3),
        dict(hidden_size=32, num_attention_heads=2, num_layers=1, time_embed_dim=16, num_frames=9, latent_height=2,
             latent_width=2, in_channels=16, out_channels=16, text_hidden_size=8, r=2, lora_alpha=1),
    ],
)
def test_random_checkpoints_of_other_sizes_convert_exactly(tmp_path, ref, sizes):
    """A random SAT checkpoint of other sizes, converted and loaded, computes what a float64 SAT forward written
    from the reference README's facts computes (both CFG rows: the stored null tokens and a random s_a)."""
    from animegamer.official.sat_layout import read_model_yaml
    from tests.helpers.sat_reference import sat_forward, write_random_checkpoint

    tree = json.loads(json.dumps(ref[0]["tiny_model_yaml"]))
    net = tree["model"]["network_config"]["params"]
    for key in ("hidden_size", "num_attention_heads", "num_layers", "time_embed_dim", "num_frames", "latent_height",
                "latent_width", "in_channels", "out_channels"):
        net[key] = sizes[key]
    net["modules"]["patch_embed_config"]["params"]["text_hidden_size"] = sizes["text_hidden_size"]
    net["modules"]["lora_config"]["params"].update(r=sizes["r"], lora_alpha=sizes["lora_alpha"])
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(tree))
    spec = read_model_yaml(tmp_path / "model.yaml")
    state = write_random_checkpoint(tmp_path / "sat", spec, seed=sizes["hidden_size"])
    base = _write_base(tmp_path / "base", spec.in_channels)
    summary = convert_decoder(tmp_path / "sat", tmp_path / "out", model_yaml=tmp_path / "model.yaml", base_dir=base)
    assert summary["lora_scale"] == sizes["lora_alpha"] / sizes["r"]
    cfg = DecoderConfig(**summary["decoder_config"], dtype="fp32", gradient_checkpointing=False)
    decoder = load_decoder(summary["decoder_checkpoint"], cfg, with_vae=False)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, spec.latent_frames, spec.in_channels, spec.latent_height, spec.latent_width, generator=g)
    s_a = torch.randn(1, spec.text_length, spec.hidden_size, generator=g)
    tokens = torch.cat([decoder.null_shot_embeds(1), s_a])
    timestep, flow = torch.tensor([731.0, 731.0]), torch.tensor([10.0, 10.0])
    with torch.no_grad():
        ours = decoder(torch.cat([x, x]), timestep, tokens, motion_value=flow)
    expected = sat_forward(state, spec, torch.cat([x, x]), timestep, flow, tokens)
    assert rel(ours, expected) < 1e-5

    # the stored null tokens are the fusion of zero T5 and zero CLIP inputs, run through the SAT layers
    def fusion(name, norm, width, count):
        z = torch.zeros(count, width, dtype=torch.float64)
        w = {k: v.double() for k, v in state.items() if k.startswith(f"mixins.patch_embed.{name}")}
        hidden = F.gelu(z @ w[f"mixins.patch_embed.{name}.0.weight"].T + w[f"mixins.patch_embed.{name}.0.bias"])
        hidden = hidden @ w[f"mixins.patch_embed.{name}.2.weight"].T + w[f"mixins.patch_embed.{name}.2.bias"]
        n = f"mixins.patch_embed.{norm}"
        return F.layer_norm(hidden, (spec.hidden_size,), state[f"{n}.weight"].double(), state[f"{n}.bias"].double())

    n_text = spec.text_length - spec.image_tokens
    null = torch.cat([fusion("text_proj", "txt_mix_layer_norm", spec.text_hidden_size, n_text),
                      fusion("ip_proj", "ip_mix_layer_norm", spec.ip_hidden_size, spec.image_tokens)])
    assert rel(decoder.null_shot_embeds(1)[0], null) < 1e-6
