"""The numbers of research/official/DECODER_NOTES.md, measured on a reference set (CPU):

    python research/official/measure_decoder.py [REF_DIR]      # default tests/data/official_ref

Converts the set's SAT checkpoint into a temp dir, loads it through load_decoder, and prints the parity of the
release sampler and the effect of switching each release quirk off, of zero null tokens, of diffusers' norm_out
eps, of fp16, and how SAT's schedule differs from diffusers' CogVideoXDPMScheduler.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch
import yaml
from diffusers import CogVideoXDDIMScheduler, CogVideoXDPMScheduler
from safetensors.torch import load_file

from animegamer.config import DecoderConfig
from animegamer.models.trained import load_decoder
from animegamer.official.decoder import convert_decoder
from animegamer.official.game import cast_transformer, release_sampler_settings
from animegamer.official.sampler import NO_QUIRKS, RELEASED, denoise, denoiser_table, sample_released, sampler_schedule
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER


def _sibling(name: str):
    """The research tool beside this one (a program, not a package) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_MLLM_TOOL = _sibling("measure_mllm")  # the sibling tool: its reference set and norm
DEFAULT_REF, rel = _MLLM_TOOL.DEFAULT_REF, _MLLM_TOOL.rel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ref", nargs="?", type=Path, default=DEFAULT_REF, help="the official reference set directory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        measure(args.ref, Path(tmp))


def measure(ref: Path, tmp: Path) -> None:
    """Print the measurements; ``tmp`` holds the converted checkpoint."""
    meta, t = json.loads((ref / "decoder_ref.json").read_text()), load_file(str(ref / "decoder_ref.safetensors"))
    (tmp / "m.yaml").write_text(yaml.safe_dump(meta["tiny_model_yaml"]))
    s = convert_decoder(ref / "decoder_ckpt", tmp / "out", model_yaml=tmp / "m.yaml")
    # no base CogVideoX given: the converted folder gets the CogVideoX-2B scheduler load_decoder needs (no VAE)
    CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER).save_pretrained(str(tmp / "out" / "CogVideoX" / "scheduler"))
    cfg = DecoderConfig(**s["decoder_config"], dtype="fp32")
    load = lambda: load_decoder(s["decoder_checkpoint"], cfg, with_vae=False)  # noqa: E731
    dec = load()
    st = release_sampler_settings(s["decoder_checkpoint"])
    steps = len(t["sample_6step.x_in_per_step"]) if "sample_6step.x_in_per_step" in t else 6
    run, pre = meta[f"sample_{steps}step"], f"sample_{steps}step"
    def six(d, q=RELEASED):
        shape = tuple(t[pre + ".init_noise"].shape[1:])
        return sample_released(d, t["s_a"], torch.tensor([run["flow_value"]]), shape, st, steps,
                               st["guidance_scale"], st["guidance_exponent"], noises=iter(t[pre + ".step_noises"]),
                               init_noise=t[pre + ".init_noise"], quirks=q)
    ref6 = t[pre + ".samples"]
    print("released 6-step samples vs official", rel(six(dec), ref6))
    for f in ["snap_alpha", "cfg_on_timestep", "discarded_draw", "bf16_shots"]:
        print(f"  {f} off: samples change", rel(six(dec, dataclasses.replace(RELEASED, **{f: False})), ref6))
    print("  all off", rel(six(dec, NO_QUIRKS), ref6))
    table = denoiser_table(st)
    for c in meta["forward_cases"]:
        x, tag = t[f"fwd_{c['tag']}.x"], c["tag"]
        flow = torch.full((2,), c["flow_value"])
        shots = torch.cat([dec.null_shot_embeds(1), t["s_a"]])
        with torch.no_grad():
            nosnap = denoise(dec, x, c["timestep_idx"], c["alpha_cumprod_sqrt"], shots, flow, table, NO_QUIRKS)
            zeros = torch.cat([torch.zeros_like(t["s_a"]), t["s_a"]])
            zero_null = dec(torch.cat([x, x]), torch.full((2,), float(c["timestep_idx"])), zeros, motion_value=flow)
        print(f"case {tag}: denoised without snapping", rel(nosnap, t[f"fwd_{tag}.denoised"]),
              "| uncond dit_out with zero null tokens", rel(zero_null[0], t[f"fwd_{tag}.dit_out"][0]))
    dec.transformer.norm_out.norm.eps = 1e-5
    c = meta["forward_cases"][0]
    with torch.no_grad():
        out = dec(torch.cat([t["fwd_a.x"]] * 2), torch.full((2,), float(c["timestep_idx"])),
                  torch.cat([dec.null_shot_embeds(1), t["s_a"]]), motion_value=torch.full((2,), c["flow_value"]))
    print("case a: dit_out with norm_out eps 1e-5 (diffusers default)", rel(out, t["fwd_a.dit_out"]))
    half = load()
    cast_transformer(half, torch.float16)  # the release's fp16 transformer (compat: released)
    print("released fp16 (CPU) 6-step samples vs official fp32", rel(six(half), ref6))
    for n in (6, 50):
        a_sat, ts_sat = sampler_schedule(n, st)
        sch = CogVideoXDPMScheduler(**COGVIDEOX_2B_SCHEDULER)
        sch.set_timesteps(n)
        ts = sch.timesteps.flip(0)
        a_dif = sch.alphas_cumprod[ts].sqrt()
        print(f"{n} steps: SAT timesteps == diffusers trailing: {torch.equal(ts, ts_sat)}; max |sqrt(abar) diff| "
              f"{float((a_dif.flip(0).float() - a_sat).abs().max()):.3e}")


if __name__ == "__main__":
    main()
