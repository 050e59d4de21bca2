"""The trained parts of an :class:`~animegamer.models.decoder.AnimationShotDecoder` on disk.

    decoder/
      adapter_config.json, adapter_model.safetensors   the LoRA on the transformer's attention (peft layout)
      motion_embedding.safetensors                    the motion level embedding (``ofs_embedding``)
      decoder_config.json                             the settings the parts need to be loaded back
      null_shot_embeds.safetensors                    optional: learned unconditional tokens (N, H)

Only trained parameters are written; the frozen CogVideoX weights come from ``decoder.pretrained``. A checkpoint may
also record, in ``decoder_config.json``, the value its motion embedding sees per level (``motion_values``) and
LayerNorm eps diffusers' config cannot express (``layernorm_eps``), and carry unconditional tokens of its own: a
checkpoint converted from the official release does (animegamer.official.decoder). Loading adopts them; their
absence means this project's own behaviour. Keys this module does not know (the release sampler's settings of a
converted checkpoint, read by animegamer.official) are left alone.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from animegamer.config.recorded import DECODER_CONFIG  # the file config.recorded reads the decoder's shape from
from animegamer.io import atomic_write_json, read_json_bounded
from animegamer.models.weights import load_state_dict_file, save_state_dict_file, sort_adapter_targets

ADAPTER_WEIGHTS = "adapter_model.safetensors"
MOTION_WEIGHTS = "motion_embedding.safetensors"
NULL_SHOT_WEIGHTS = "null_shot_embeds.safetensors"  # optional learned unconditional tokens (N, H)


def save_parts(decoder, out_dir: str | Path, state_dict: dict | None = None) -> None:
    """Write ``decoder``'s trained parts and the settings they need into ``out_dir``. ``state_dict``: the trained
    tensors keyed as in ``decoder.state_dict()``, gathered where the module holds only shards (ZeRO-3, FSDP2);
    by default the module's own parameters."""
    from peft.utils import get_peft_model_state_dict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if decoder.lora_rank > 0:
        decoder.lora_config().save_pretrained(str(out))
        sort_adapter_targets(out)
        transformer = None if state_dict is None else _under(state_dict, "transformer.")
        save_state_dict_file(get_peft_model_state_dict(decoder.transformer, state_dict=transformer),
                             out / ADAPTER_WEIGHTS)
    if decoder.motion_scope:
        motion = (decoder.transformer.ofs_embedding.state_dict() if state_dict is None
                  else _under(state_dict, "transformer.ofs_embedding."))
        save_state_dict_file(motion, out / MOTION_WEIGHTS)
    settings = {
        "lora_rank": decoder.lora_rank,
        "lora_alpha": decoder.lora_alpha,
        "lora_targets": decoder.lora_targets,
        "motion_scope": decoder.motion_scope,
        "num_motion_levels": decoder.num_motion_levels,
        "motion_embed_dim": decoder.motion_embed_dim,
        "motion_guidance": decoder.motion_guidance,
    }
    if decoder.motion_values is not None:
        settings["motion_values"] = decoder.motion_values
    if decoder.layernorm_eps:
        settings["layernorm_eps"] = decoder.layernorm_eps
    if decoder.null_shot is not None:
        save_state_dict_file({"null_shot_embeds": decoder.null_shot}, out / NULL_SHOT_WEIGHTS)
    atomic_write_json(out / DECODER_CONFIG, settings)


def _under(state: dict, prefix: str) -> dict:
    return {name[len(prefix):]: value for name, value in state.items() if name.startswith(prefix)}


def load_parts(decoder, in_dir: str | Path) -> None:
    """Load what :func:`save_parts` wrote into ``decoder``; its LoRA/motion settings must match the files'.

    ``motion_guidance`` is taken from the checkpoint (files without it: False): how the level was dropped in
    training decides how the checkpoint samples.
    """
    from peft import LoraConfig
    from peft.utils import set_peft_model_state_dict

    src = Path(in_dir)
    if not (src / DECODER_CONFIG).is_file():
        raise FileNotFoundError(f"no trained decoder at {src} (missing {DECODER_CONFIG})")
    saved = read_json_bounded(src / DECODER_CONFIG)
    mine = {"lora_rank": decoder.lora_rank, "motion_scope": decoder.motion_scope}
    if any(saved.get(k) != v for k, v in mine.items()):
        raise ValueError(f"{src}: trained with {saved}, but this decoder is configured with {mine}")
    if decoder.lora_rank > 0:
        lora = LoraConfig.from_pretrained(str(src))
        if lora.r != decoder.lora_rank or lora.lora_alpha != decoder.lora_alpha:
            raise ValueError(f"{src}: LoRA r={lora.r} alpha={lora.lora_alpha} does not match decoder config")
        result = set_peft_model_state_dict(decoder.transformer, load_state_dict_file(src / ADAPTER_WEIGHTS))
        unexpected = getattr(result, "unexpected_keys", None) or []
        if unexpected:
            raise ValueError(f"{src / ADAPTER_WEIGHTS}: unexpected LoRA weights {unexpected[:3]}")
    if decoder.motion_scope:
        decoder.transformer.ofs_embedding.load_state_dict(load_state_dict_file(src / MOTION_WEIGHTS))
    decoder.motion_guidance = bool(saved.get("motion_guidance", False))
    _load_checkpoint_settings(decoder, src, saved)


def _load_checkpoint_settings(decoder, src: Path, saved: dict) -> None:
    """Adopt the settings a checkpoint records (a converted release's; absent keys: our own decoder's behaviour)."""
    values = saved.get("motion_values")
    if values is not None and len(values) != decoder.num_motion_levels:
        raise ValueError(f"{src}: motion_values has {len(values)} entries for {decoder.num_motion_levels} levels")
    decoder.motion_values = [float(v) for v in values] if values is not None else None
    decoder.layernorm_eps = {str(k): float(v) for k, v in saved.get("layernorm_eps", {}).items()}
    modules = dict(decoder.transformer.named_modules())
    for name, eps in decoder.layernorm_eps.items():
        if not isinstance(modules.get(name), nn.LayerNorm):
            raise ValueError(f"{src}: layernorm_eps names {name!r}, not a LayerNorm of the transformer")
        modules[name].eps = eps
    null = None
    if (src / NULL_SHOT_WEIGHTS).is_file():
        null = load_state_dict_file(src / NULL_SHOT_WEIGHTS)["null_shot_embeds"]
        expected = (decoder.num_condition_tokens, decoder.hidden_size)
        if tuple(null.shape) != expected:
            raise ValueError(f"{src / NULL_SHOT_WEIGHTS}: shape {tuple(null.shape)}, the decoder needs {expected}")
        null = null.float().to(decoder.device)
    decoder.null_shot = null
