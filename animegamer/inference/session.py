"""Build a playable game from an inference config: the MLLM predictor, the decoder renderer, the session.

    session = build_session(load_config("configs/tiny/inference.yaml"))
    turn = session.play("Character: Qiqi; Motion: run; Background: park.")

``offload: sequential`` keeps each model on the CPU and moves it to the GPU only while it runs, so the MLLM and
the decoder are never resident at once (a full game then fits a 24 GB GPU). ``fast: true`` swaps the sampling
settings for the fast preset (:func:`fast_sampling`).
``merge_lora: true`` folds both LoRAs into their base weights and ``compile: true`` compiles the decoder's
transformer blocks: the lossless fast path (outputs change by weight rounding only), measured by scripts/benchmark.py.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from animegamer.config import InferenceConfig, SamplingConfig
from animegamer.config.recorded import history_turns_note
from animegamer.inference.game import GameSession, check_game_settings
from animegamer.inference.mllm_runner import HistoryTurn, MLLMRunner, TurnPrediction
from animegamer.models.causal_decoder import CausalLatentDecoder, vae_layout
from animegamer.models.fp8 import quantize_transformer_fp8
from animegamer.models.sampling_presets import PresetSampler, check_render_options
from animegamer.models.streaming import decode_chunks, latent_frame_batches
from animegamer.models.trained import load_small_decoder, small_decoder_dir
from animegamer.training.checkpoint import resolve_checkpoint


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


FAST_STEPS = 12


def fast_sampling(sampling: SamplingConfig) -> SamplingConfig:
    """The fast preset: DPM-Solver++(2M) in 12 steps, classifier-free guidance on the first 40% of them only.

    Guidance matters most while the layout forms (high noise); the late steps refine detail and run the
    conditional branch alone, which halves their cost. 17 transformer calls instead of 99 at the paper's settings.
    The quality cost is measured by scripts/evaluate.py (SpriteWorld ablations, README).
    """
    steps = min(sampling.steps, FAST_STEPS)
    return dataclasses.replace(sampling, scheduler="dpm", steps=steps, guidance_steps_fraction=0.4)


@contextmanager
def on_device(module: torch.nn.Module, device: str, offload: bool):
    """Run a block with ``module`` on ``device``; with offload, move it back to the CPU afterwards."""
    if offload:
        module.to(device)
    try:
        yield module
    finally:
        if offload:
            module.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


class MLLMPredictor:
    """The MLLM runner, with the model moved to the GPU only while it predicts when offloading."""

    def __init__(self, runner: MLLMRunner, device: str, offload: bool = False):
        self.runner, self.device, self.offload = runner, device, offload

    @property
    def shot_shape(self) -> tuple[int, int]:
        """(num_slots, shot_dim) of the shots this model predicts and reads back as history."""
        return self.runner.model.num_slots, self.runner.model.shot_dim

    def validate(self, instruction: str) -> None:
        """The live check of an instruction (token count, reserved tokens): InstructionError (a ValueError)."""
        self.runner.validate(instruction)

    def predict_turn(self, history: list[HistoryTurn], instruction: str) -> TurnPrediction:
        with on_device(self.runner.model, self.device, self.offload):
            return self.runner.predict_turn(history, instruction)


class DecoderRenderer:
    """Renders a shot representation with the decoder: (N, H) s_a + motion level -> (T, H, W, 3) uint8."""

    def __init__(self, decoder, sampling: SamplingConfig, device: str, offload: bool = False,
                 sampler: PresetSampler | None = None, small_decoder: CausalLatentDecoder | None = None):
        self.decoder, self.device, self.offload = decoder, device, offload
        self.small_decoder = small_decoder  # sampling.vae=small: decodes the latents in place of the VAE
        # sampling.preset / sampling.cache (animegamer.models.sampling_presets); plain settings without one
        self.sampler = sampler if sampler is not None else PresetSampler(decoder, sampling)
        self.sampling = self.sampler.sampling
        self.fps = sampling.fps

    def render(self, shot_embeds: torch.Tensor, motion_level: int, seed: int,
               progress: Callable[[str, float], None] | None = None,
               on_frames: Callable[[np.ndarray, int, int], None] | None = None) -> np.ndarray:
        """``progress`` hears "denoising step/steps" after every step, then "decoding", with the fraction done
        (the decode counted as one more step). The VAE decodes the clip chunk by chunk
        (animegamer.models.streaming); ``on_frames(frames (t, H, W, 3), index, count)`` gets each chunk as soon as
        it is decoded, so the first frames can be shown before the rest (together: the returned frames)."""
        generator = torch.Generator().manual_seed(seed)
        on_step = (lambda step, steps: progress(f"denoising {step}/{steps}", step / (steps + 1))) if progress else None
        with on_device(self.decoder, self.device, self.offload):
            latents = self.sampler.latents(
                shot_embeds[None].to(self.decoder.dtype),  # (1, N, H)
                torch.tensor([motion_level]),
                generator,
                on_step=on_step,
            )  # (1, F, C, h, w)
            if progress:
                progress("decoding", 1 - 1 / (self.sampling.steps + 1))
            count = len(latent_frame_batches(latents.shape[1], self.decoder.vae.num_latent_frames_batch_size))
            if self.small_decoder is not None:
                count = self.small_decoder.num_chunks(latents.shape[1])
            chunks = []
            for index, chunk in enumerate(self._decode_chunks(latents)):  # (1, t, H, W, 3) uint8
                chunks.append(chunk[0].numpy())
                if on_frames is not None:
                    on_frames(chunks[-1], index, count)
        return np.concatenate(chunks)  # (T, H, W, 3)

    def render_many(self, shots: Sequence[torch.Tensor], motion_levels: Sequence[int],
                    seeds: Sequence[int]) -> list[np.ndarray]:
        """Several clips in one batch (the evaluation's way to fill a CPU): each drawn from its own seed's
        generator, as :meth:`render` draws it alone, so a clip differs from its single render by float rounding
        only. A cache method decides its skips for the whole batch: with one, the clips render one at a time."""
        if not len(shots) == len(motion_levels) == len(seeds):
            raise ValueError(f"{len(shots)} shots, {len(motion_levels)} levels and {len(seeds)} seeds")
        if not shots:
            return []
        if self.sampler.cache is not None:
            return [self.render(*clip) for clip in zip(shots, motion_levels, seeds, strict=True)]
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        with on_device(self.decoder, self.device, self.offload):
            latents = self.sampler.latents(
                torch.stack(list(shots)).to(self.decoder.dtype),  # (B, N, H)
                torch.tensor(list(motion_levels)),
                generators,
            )  # (B, F, C, h, w)
            frames = torch.cat(list(self._decode_chunks(latents)), dim=1)  # (B, T, H, W, 3) uint8
        return list(frames.numpy())

    def _decode_chunks(self, latents: torch.Tensor):
        """uint8 frame chunks of the latents: the VAE's decode batches, or the small decoder's latent frames."""
        if self.small_decoder is not None:
            return self.small_decoder.decode_chunks(latents)
        return decode_chunks(self.decoder.vae, latents)


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


def check_output_dir(path: str | Path, key: str = "output_dir") -> None:
    """``path`` exists as a directory (made if need be) in which files can be written: ValueError otherwise."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"{key}={path} is not a writable directory ({exc.strerror or exc})") from None


def check_device(name: str) -> None:
    """A device that this machine has: ValueError naming the setting otherwise (cuda without a GPU, cuda:N past
    the last GPU, mps off a Mac)."""
    if name.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(name.partition(":")[2] or 0)
        if index >= count:
            found = f"{count} CUDA GPU(s)" if count else "no CUDA GPU"
            raise ValueError(f"device={name} but this machine has {found} (device=auto picks what there is)")
    elif name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device=mps but MPS is not available here (device=auto picks what there is)")


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


def check_core_compat(cfg: InferenceConfig) -> None:
    """The core plays ``compat: fixed``; the release's own predictor and renderer are built by the entry points
    (animegamer.official.game), never here."""
    if cfg.compat != "fixed":
        raise ValueError(f"compat={cfg.compat}: the release's own predictor and renderer play through app.py, "
                         "inference_MLLM.py, inference_Decoder.py or python -m animegamer.official.play")


def load_mllm_predictor(cfg: InferenceConfig, device: str, offload: bool) -> MLLMPredictor:
    from animegamer.models.mllm import AnimeGamerMLLM

    check_core_compat(cfg)

    model = AnimeGamerMLLM.from_config(cfg.mllm, device="cpu" if offload else device)
    if cfg.mllm_checkpoint:
        model.load_trained(resolve_checkpoint(cfg.mllm_checkpoint))
    else:
        print("warning: mllm_checkpoint is empty: the MLLM runs with untrained LoRA/resamplers", file=sys.stderr)
    if cfg.merge_lora:
        model.merge_lora()
    print(history_turns_note(cfg), file=sys.stderr)  # which K and why (config.recorded)
    runner = MLLMRunner(
        model,
        history_turns=cfg.history_turns,
        max_instruction_tokens=cfg.mllm.max_instruction_tokens,
    )
    return MLLMPredictor(runner, device, offload)


def load_renderer(cfg: InferenceConfig, device: str, offload: bool) -> DecoderRenderer:
    from animegamer.models.decoder import AnimationShotDecoder
    from animegamer.models.trained import load_decoder

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
    if cfg.merge_lora:
        decoder.merge_lora()
    if cfg.compile:
        decoder.compile_blocks()
    if cfg.compile_vae:
        decoder.compile_vae()
    if cfg.fp8:  # after the LoRA is folded in: FP8 weights carry no adapter
        decoder.merge_lora()
        quantize_transformer_fp8(decoder)
    sampling = dataclasses.replace(cfg.sampling, preset="fast") if cfg.fast else cfg.sampling
    sampler = PresetSampler.build(decoder, sampling, cfg.decoder_checkpoint)
    small = None
    if cfg.sampling.vae == "small":  # stage (e): small enough to stay on the device even when offloading
        small = load_small_decoder(cfg.sampling.small_decoder, device).to(decoder.dtype)
        small.check_vae(*vae_layout(decoder.vae.config, "decoder.pretrained's VAE"), cfg.sampling.small_decoder)
        if cfg.compile:
            small.compile_blocks()
    return DecoderRenderer(decoder, sampling, device, offload, sampler, small)


def build_session(cfg: InferenceConfig, render: bool = True, output_dir: str | Path | None = None, *,
                  predictor_loader: Callable = load_mllm_predictor,
                  renderer_loader: Callable = load_renderer) -> GameSession:
    """The predictor and (if ``render``) the renderer of ``cfg``, in a fresh :class:`GameSession`.
    A missing checkpoint raises FileNotFoundError before any model loads. The loaders (``(cfg, device, offload)``
    -> predictor / renderer) are the core's unless an entry point picks others (animegamer.official.game)."""
    check_checkpoints(cfg, decoder=render)
    device = resolve_device(cfg.device)
    offload = cfg.offload == "sequential" and device != "cpu"
    torch.manual_seed(cfg.seed)
    predictor = predictor_loader(cfg, device, offload)
    renderer = renderer_loader(cfg, device, offload) if render else None
    return GameSession(
        predictor,
        renderer,
        history_turns=cfg.history_turns,
        output_dir=output_dir if output_dir is not None else cfg.output_dir,
        seed=cfg.seed,
    )
