"""Build the game of an inference config, honouring every inference option, for every entry point.

    game = build_game(load_config("configs/tiny/inference.yaml"))          # an AnimeGamer: MLLM + decoder
    session = build_session(cfg)                                            # the same in a fresh GameSession
    turn = session.play("Character: Qiqi; Motion: run; Background: park.")

``build_game(cfg, mllm=..., render=...)`` is the one place a config becomes models: ``device``, ``seed``,
``history_turns``, ``merge_lora`` (both LoRAs folded into their base weights), ``offload: sequential`` (each model
on the CPU, on the GPU only while it runs, so the MLLM and the decoder are never resident at once: a full game
fits a 24 GB GPU), ``compile`` / ``compile_vae`` (the decoder's transformer blocks / VAE decoder), ``fp8``,
``sampling.preset`` (``fast: true`` is its alias, folded in when the config loads) and ``sampling.cache``.
The terminal and browser games, inference_MLLM.py, inference_Decoder.py and the evaluation all build here.
Every weights path and rendering option is checked before any model loads (:func:`check_checkpoints`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from animegamer.cli import UsageError
from animegamer.config import InferenceConfig
from animegamer.config.recorded import history_turns_note
from animegamer.data.vocabulary import Vocabulary, load_vocabulary
from animegamer.game.predictor import MLLMPredictor
from animegamer.game.preflight import check_device, check_output_dir
from animegamer.game.renderer import DecoderRenderer
from animegamer.game.session import GameSession, check_game_settings
from animegamer.game.turn import AnimeGamer
from animegamer.io import checkpoint_decoder_dir, resolve_checkpoint
from animegamer.models.causal_decoder import vae_layout
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.fp8 import fp8_unavailable, quantize_transformer_fp8
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.trained import load_decoder, load_small_decoder, small_decoder_dir
from animegamer.sampling.cache import MagRatios
from animegamer.sampling.fewstep import SAMPLER_FILE
from animegamer.sampling.presets import PresetSampler, effective_sampling


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def weights_hint(key: str, path: str) -> str:
    """What to do about a missing weights path: the tiny models are built, trained parts trained, base weights
    converted from the release, and the shipped SpriteWorld world plays without any of them."""
    if Path(path).parts[:2] == ("checkpoints", "tiny"):
        return "build the tiny random models with `make tiny`"
    if key == "sampling.small_decoder":
        return "train it (scripts/train_stage_e.py) and point sampling.small_decoder= at its run, or sampling.vae=full"
    if key.endswith("_checkpoint"):
        return (f"train it first, point {key}= at a trained checkpoint or set {key}='' to run untrained parts; "
                "to play now: make play (the shipped SpriteWorld world)")
    return ("convert the released AnimeGamer weights with scripts/convert_official.py (README: 'Play the released "
            "weights'), or play the shipped SpriteWorld world: make play "
            "(--config configs/spriteworld/inference.yaml)")


def check_play_settings(cfg: InferenceConfig) -> None:
    """What a game needs of its settings, checked before any model loads (ValueError naming the setting): a seed
    and K that its saves can hold, sampling sizes that make a clip, a device this machine has, an ``output_dir``
    it can write in (made if need be)."""
    check_game_settings(cfg.seed, cfg.history_turns)
    for name in ("steps", "num_frames", "height", "width", "fps"):
        value = getattr(cfg.sampling, name)
        if value < 1:
            raise ValueError(f"sampling.{name}={value} must be >= 1")
    check_device(cfg.device)
    check_output_dir(cfg.output_dir)


def prepare_play(cfg: InferenceConfig, build: Callable[[InferenceConfig], Any]) -> tuple[Vocabulary, Any]:
    """What a play entry point (the terminal, the browser) starts with: the world's words and ``build(cfg)`` (a
    game or a session). Settings, weights paths and the vocabulary file are checked before any model loads; a
    problem is a :class:`~animegamer.cli.UsageError` (the program's one ``error:`` line)."""
    try:
        check_play_settings(cfg)
        return load_vocabulary(cfg.mllm_checkpoint), build(cfg)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def check_checkpoints(cfg: InferenceConfig, mllm: bool = True, decoder: bool = True, base_only: bool = False) -> None:
    """Every weights folder the config names, before any model loads, so a wrong path costs no loading time:
    FileNotFoundError with one line naming every missing key and path and what to do (:func:`weights_hint` of the
    first). An empty checkpoint means "none" (untrained parts, with a warning); the base folders are always needed.
    ``base_only`` checks the base folders alone (inference_MLLM checks its input with the tokenizer first)."""
    named = []
    if mllm:
        named += [("mllm.pretrained", cfg.mllm.pretrained), ("mllm_checkpoint", cfg.mllm_checkpoint)]
    if decoder:
        named += [("decoder.pretrained", cfg.decoder.pretrained), ("decoder_checkpoint", cfg.decoder_checkpoint)]
        if cfg.sampling.vae == "small":
            if not cfg.sampling.small_decoder:
                raise ValueError("sampling.vae=small needs sampling.small_decoder: a stage (e) run "
                                 "(scripts/train_stage_e.py) or its small_decoder/ directory")
            named.append(("sampling.small_decoder", cfg.sampling.small_decoder))
    missing = []
    for key, value in named:
        trained = key.endswith(("_checkpoint", "small_decoder"))
        if trained and (base_only or not value):
            continue
        try:
            if key == "sampling.small_decoder":
                found = small_decoder_dir(value)
            else:
                found = resolve_checkpoint(value) if trained else Path(value)
        except FileNotFoundError:
            found = None
        if found is None or not found.is_dir():
            missing.append((key, value))
    if missing:
        names = ", ".join(f"{key}={value}" for key, value in missing)
        raise FileNotFoundError(f"not found: {names}: {weights_hint(*missing[0])}")
    if decoder:  # sampling.preset=distilled needs a stage (d) checkpoint; fp8 a capable GPU
        check_render_options(cfg, resolve_device(cfg.device))


def check_render_options(cfg: InferenceConfig, device: str) -> None:
    """The rendering options of an inference config that cannot work, before any model loads: one-line
    FileNotFoundError / ValueError (``distilled`` without a stage (d) checkpoint,
    ``magcache`` without its ratios or with ratios for another step count, FP8 without compile, off a capable GPU
    or with offloading)."""
    if cfg.sampling.cache == "magcache":
        if not cfg.sampling.magcache_ratios:
            raise ValueError("sampling.cache=magcache needs sampling.magcache_ratios: calibrate them for this "
                             "decoder and sampler with scripts/calibrate_magcache.py")
        # the distilled student's step count is in its sampler.json: checked when the sampler is built
        MagRatios.load(cfg.sampling.magcache_ratios,
                       None if cfg.sampling.preset == "distilled" else effective_sampling(cfg.sampling).steps)

    if cfg.sampling.preset == "distilled":
        if not cfg.decoder_checkpoint:
            raise ValueError("sampling.preset=distilled needs a stage (d) decoder_checkpoint")
        decoder_dir = checkpoint_decoder_dir(cfg.decoder_checkpoint)
        if not (decoder_dir / SAMPLER_FILE).is_file():
            raise FileNotFoundError(f"{decoder_dir / SAMPLER_FILE} is missing: sampling.preset=distilled needs a "
                                    "stage (d) decoder (scripts/train_stage_d.py)")
    if cfg.fp8:
        if not cfg.compile:  # measured: torchao's FP8 eagerly is slower than bf16 (docs/performance.md)
            raise ValueError("fp8 runs under torch.compile: set compile=true too (eager FP8 is slower than bf16)")
        if cfg.offload == "sequential":
            raise ValueError("fp8 keeps the transformer's FP8 weights on the GPU: it does not combine with "
                             "offload=sequential")
        problem = fp8_unavailable(device)
        if problem:
            raise ValueError(problem)


def check_core_compat(cfg: InferenceConfig) -> None:
    """The core plays ``compat: fixed``; the release's own predictor and renderer are built by the entry points
    (animegamer.official.game), never here."""
    if cfg.compat != "fixed":
        raise ValueError(f"compat={cfg.compat}: the release's own predictor and renderer play through app.py, "
                         "inference_MLLM.py, inference_Decoder.py or python -m animegamer.play")


def load_mllm_predictor(cfg: InferenceConfig, device: str, offload: bool) -> MLLMPredictor:
    """The core's MLLM (``compat: fixed``) from ``cfg``: trained parts loaded, LoRA merged if asked."""
    check_core_compat(cfg)
    model = AnimeGamerMLLM.from_config(cfg.mllm, device="cpu" if offload else device)
    if cfg.mllm_checkpoint:
        model.load_trained(resolve_checkpoint(cfg.mllm_checkpoint))
    else:
        print("warning: mllm_checkpoint is empty: the MLLM runs with untrained LoRA, query embeddings and "
              "resamplers; predictions are meaningless", file=sys.stderr)
    if cfg.merge_lora:
        model.merge_lora()
    print(history_turns_note(cfg), file=sys.stderr)  # which K and why (config.recorded)
    return MLLMPredictor(model, device, offload, max_instruction_tokens=cfg.mllm.max_instruction_tokens)


def load_renderer(cfg: InferenceConfig, device: str, offload: bool) -> DecoderRenderer:
    """The core's decoder renderer (``compat: fixed``) from ``cfg``: every decoder and sampling option applied."""
    check_core_compat(cfg)
    target = "cpu" if offload else device
    if cfg.decoder_checkpoint:
        decoder = load_decoder(cfg.decoder_checkpoint, cfg.decoder, device=target)
    else:
        print("warning: decoder_checkpoint is empty: the decoder runs without trained LoRA", file=sys.stderr)
        decoder = AnimationShotDecoder.from_config(cfg.decoder, device=target).eval()
    if cfg.decoder.vae_slicing and hasattr(decoder.vae, "enable_slicing"):
        decoder.vae.enable_slicing()
    if cfg.decoder.vae_tiling and hasattr(decoder.vae, "enable_tiling"):
        decoder.vae.enable_tiling()
    if cfg.merge_lora or cfg.fp8:  # FP8 weights carry no adapter: the LoRA is folded in first
        decoder.merge_lora()
    if cfg.fp8:  # as measured fastest: per-tensor scales, the AdaLN linears in bf16, compiled below
        quantize_transformer_fp8(decoder, granularity="tensor", large_only=True)
    if cfg.compile:
        decoder.compile_blocks()
    if cfg.compile_vae:
        decoder.compile_vae()
    sampler = PresetSampler.build(decoder, cfg.sampling, cfg.decoder_checkpoint)
    small = None
    if cfg.sampling.vae == "small":  # stage (e): small enough to stay on the device even when offloading
        small = load_small_decoder(cfg.sampling.small_decoder, device).to(decoder.dtype)
        small.check_vae(*vae_layout(decoder.vae.config, "decoder.pretrained's VAE"), cfg.sampling.small_decoder)
        if cfg.compile:
            small.compile_blocks()
    return DecoderRenderer(decoder, cfg.sampling, device, offload, sampler, small)


# (cfg, device, offload) -> a predictor or a renderer: the core's loaders, or those an entry point picks
# (animegamer.official.game: the release's own under compat: released)
Loader = Callable[[InferenceConfig, str, bool], Any]


def build_game(cfg: InferenceConfig, mllm: bool = True, render: bool = True, *,
               predictor_loader: Loader = load_mllm_predictor, renderer_loader: Loader = load_renderer) -> AnimeGamer:
    """The :class:`AnimeGamer` of ``cfg``: its MLLM (unless ``mllm`` is false: render recorded predictions only)
    and its decoder (unless ``render`` is false: predict only), from the core's loaders unless others are given.
    A missing checkpoint or an impossible rendering option, or a device this machine does not have, raises
    FileNotFoundError / ValueError before any model loads."""
    check_checkpoints(cfg, mllm=mllm, decoder=render)
    device = check_device(cfg.device)
    offload = cfg.offload == "sequential" and device != "cpu"
    torch.manual_seed(cfg.seed)  # untrained parts (an empty checkpoint) initialise the same way every run
    predictor = predictor_loader(cfg, device, offload) if mllm else None
    renderer = renderer_loader(cfg, device, offload) if render else None
    return AnimeGamer(predictor, renderer, history_turns=cfg.history_turns, seed=cfg.seed)


def build_session(cfg: InferenceConfig, render: bool = True, output_dir: str | Path | None = None,
                  **loaders: Loader) -> GameSession:
    """:func:`build_game` in a fresh :class:`GameSession` writing to ``output_dir`` (default ``cfg.output_dir``)."""
    return GameSession(build_game(cfg, render=render, **loaders),
                       output_dir=output_dir if output_dir is not None else cfg.output_dir)
