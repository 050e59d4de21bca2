"""AnimationShotDecoder: CogVideoX-2B rendering a shot representation s_a and a motion level into a clip.

    s_a (B, 226, H) ──────────────────────────────── replaces the 226 projected T5 tokens (text projection bypassed)
    motion level (B,) ─ sinusoid ─ Linear ─ SiLU ─ Linear (zero-init) ─┐
    timestep (B,) ───── sinusoid ─ CogVideoX time embedding ───────────+─ emb (B, time_embed_dim) ─ every block's AdaLN
    noisy latents (B, F, C, h, w) ─ CogVideoX transformer (+ LoRA on attention) ─ model output (B, F, C, h, w)

The motion embedding is installed in the transformer's own ``ofs`` slots (``ofs_proj``/``ofs_embedding``, the path
CogVideoX1.5-I2V uses for its offset embedding), so diffusers' forward adds it to the timestep embedding. Its last
layer starts at zero: at step 0 the decoder computes exactly what the pretrained CogVideoX computes.

Classifier-free guidance needs a defined unconditional input. Ours is the all-zero shot representation
(:meth:`AnimationShotDecoder.null_shot_embeds`): it needs no model at inference (the MLLM predicts only the
conditional s_a), and the encoder never emits it, because every s_a token leaves a LayerNorm. Training replaces
s_a with it at rate ``condition_dropout``. By default the motion level is kept in both branches, so guidance
sharpens the shot content while the level acts as a plain condition. With ``motion_guidance`` the dropout also
replaces the level by the null level 0 (a value of its own for the embedding) and the unconditional branch uses
it, so guidance amplifies what the level changes as much as what s_a changes. A trained checkpoint records which of
the two it learned, and loading it adopts that (it decides how the checkpoint samples).

Trained parts only (LoRA in peft layout + the motion embedding) are saved and loaded, as safetensors
(:mod:`animegamer.models.decoder_parts`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from animegamer.config import DecoderConfig
from animegamer.io import read_json_bounded
from animegamer.models.decoder_parts import load_parts, save_parts
from animegamer.models.vae import DTYPES, load_vae, require_dir, vae_decode, vae_encode
from animegamer.sampling.schedule import build_scheduler

NULL_MOTION_LEVEL = 0  # the unconditional level of ``motion_guidance`` decoders (real levels are 1..5)


class MotionLevelEmbedding(nn.Module):
    """Sinusoidal features of the motion level -> Linear -> SiLU -> Linear (zero-initialised).

    Computes in its own (trained, fp32) dtype whatever the frozen transformer runs in, and returns the caller's
    dtype. Parameter names match diffusers' ``TimestepEmbedding`` (``linear_1``, ``linear_2``).
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, out_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(out_dim, out_dim)
        nn.init.zeros_(self.linear_2.weight)
        nn.init.zeros_(self.linear_2.bias)

    def forward(self, sinusoid: torch.Tensor) -> torch.Tensor:
        x = sinusoid.to(self.linear_1.weight.dtype)
        return self.linear_2(self.act(self.linear_1(x))).to(sinusoid.dtype)


class AnimationShotDecoder(nn.Module):
    """CogVideoX transformer + VAE, conditioned on shot representations and motion levels."""

    def __init__(
        self,
        transformer: nn.Module,
        vae: nn.Module | None,
        scheduler_config: dict,
        lora_rank: int = 64,
        lora_alpha: int = 64,
        lora_targets: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0"),
        motion_scope: bool = True,
        num_motion_levels: int = 5,
        motion_embed_dim: int = 256,
        gradient_checkpointing: bool = False,
        motion_guidance: bool = False,
    ):
        super().__init__()
        from diffusers.models.embeddings import Timesteps

        tcfg = transformer.config
        if tcfg.use_rotary_positional_embeddings or tcfg.patch_size_t is not None:
            raise ValueError("only CogVideoX-2B-style transformers (sincos positions, 2D patches) are supported")
        if tcfg.ofs_embed_dim:
            raise ValueError("this transformer already uses its ofs embedding; the motion level needs that slot")
        transformer.requires_grad_(False)
        # s_a is already in the transformer's width: keep the pretrained T5 projection only to initialise the
        # encoder's text projection (copy_text_projection_to), and make the patch embedding pass s_a through.
        proj = transformer.patch_embed.text_proj
        # (a decoder built on the meta device, to count FLOPs, has no values to copy)
        self.text_projection_state = {k: v.detach().clone() if v.is_meta else v.detach().cpu().clone()
                                      for k, v in proj.state_dict().items()}
        transformer.patch_embed.text_proj = nn.Identity()

        self.lora_rank, self.lora_alpha, self.lora_targets = lora_rank, lora_alpha, list(lora_targets)
        if lora_rank > 0:
            transformer.add_adapter(self.lora_config())
        if motion_guidance and not motion_scope:
            raise ValueError("motion_guidance needs the motion scope (motion_scope=true)")
        self.motion_scope = motion_scope
        self.motion_guidance = motion_guidance
        self.num_motion_levels, self.motion_embed_dim = num_motion_levels, motion_embed_dim
        if motion_scope:
            transformer.ofs_proj = Timesteps(motion_embed_dim, tcfg.flip_sin_to_cos, tcfg.freq_shift)
            transformer.ofs_embedding = MotionLevelEmbedding(motion_embed_dim, tcfg.time_embed_dim)
        # Trained parameters live in fp32 whatever the frozen weights' dtype (peft casts LoRA inputs itself).
        for p in transformer.parameters():
            if p.requires_grad:
                p.data = p.data.float()
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        self.transformer = transformer
        self.vae = vae
        self.scheduler_config = dict(scheduler_config)
        self.noise_scheduler = build_scheduler("ddim", self.scheduler_config)  # add_noise / velocity for training
        # Settings a checkpoint may carry (a converted release carries them: animegamer.official.decoder); else None:
        # the value the motion embedding sees per level (the release's flow values), LayerNorm eps diffusers'
        # config cannot express, and learned unconditional shot tokens.
        self.motion_values: list[float] | None = None
        self.layernorm_eps: dict[str, float] = {}
        self.register_buffer("null_shot", None, persistent=False)

    # ------------------------------------------------------------------ building and saving

    @classmethod
    def from_config(cls, cfg: DecoderConfig, device: str | torch.device | None = None, with_vae: bool = True):
        """Load transformer, VAE and scheduler config from ``cfg.pretrained`` (diffusers layout) and add LoRA.

        ``with_vae=False`` skips the VAE (training reads precomputed latents).
        """
        from diffusers import CogVideoXTransformer3DModel

        root = Path(cfg.pretrained)
        transformer = CogVideoXTransformer3DModel.from_pretrained(
            str(require_dir(root, "transformer")), torch_dtype=DTYPES[cfg.dtype]
        )
        scheduler_dir = require_dir(root, "scheduler")
        scheduler_config = read_json_bounded(scheduler_dir / "scheduler_config.json")
        vae = load_vae(cfg) if with_vae else None
        decoder = cls.from_modules(cfg, transformer, vae, scheduler_config)
        return decoder.to(device) if device is not None else decoder

    @classmethod
    def from_modules(cls, cfg: DecoderConfig, transformer: nn.Module, vae: nn.Module | None, scheduler_config: dict):
        """Wrap already-built diffusers modules with the LoRA / motion settings of ``cfg`` (e.g. random full-size
        models built on the GPU by the benchmark)."""
        return cls(
            transformer,
            vae,
            scheduler_config,
            lora_rank=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_targets=tuple(cfg.lora_targets),
            motion_scope=cfg.motion_scope,
            num_motion_levels=cfg.num_motion_levels,
            motion_embed_dim=cfg.motion_embed_dim,
            gradient_checkpointing=cfg.gradient_checkpointing,
            motion_guidance=cfg.motion_guidance,
        )

    def lora_config(self):
        """The peft LoraConfig of this decoder's LoRA (rank, alpha, target modules)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_rank, lora_alpha=self.lora_alpha, init_lora_weights=True, target_modules=self.lora_targets
        )

    def lora_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.transformer.named_parameters() if "lora_" in n]

    def motion_parameters(self) -> list[nn.Parameter]:
        return list(self.transformer.ofs_embedding.parameters()) if self.motion_scope else []

    def trainable_parameters(self) -> list[nn.Parameter]:
        """LoRA and motion embedding: everything the decoder trains; the rest is frozen."""
        return self.lora_parameters() + self.motion_parameters()

    def copy_text_projection_to(self, linear: nn.Linear) -> None:
        """Initialise ``linear`` (the encoder's ``text_proj``) with CogVideoX's pretrained T5 projection."""
        weight, bias = self.text_projection_state["weight"], self.text_projection_state["bias"]
        if linear.weight.shape != weight.shape:
            raise ValueError(
                f"encoder text_proj {tuple(linear.weight.shape)} does not match CogVideoX's text projection "
                f"{tuple(weight.shape)}; set encoder.text_dim / encoder.hidden_dim to the decoder's sizes"
            )
        with torch.no_grad():
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)

    def save_trained(self, out_dir: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write the trained parts (LoRA, motion embedding) and the settings they need; the files are listed in
        :mod:`animegamer.models.decoder_parts`. ``state_dict``: the trained tensors gathered where this module holds
        only shards (ZeRO-3, FSDP2), keyed as in ``self.state_dict()``; by default the module's own."""
        save_parts(self, out_dir, state_dict)

    def load_trained(self, in_dir: str | Path) -> None:
        """Load what :meth:`save_trained` wrote; the LoRA/motion settings must match this decoder's, and
        ``motion_guidance`` (and a converted release's settings) are taken from the checkpoint."""
        load_parts(self, in_dir)

    # ------------------------------------------------------------------ inference fast path

    def merge_lora(self) -> None:
        """Fold the LoRA into the base weights (inference): the same outputs up to the weights' rounding, and no
        extra LoRA matmuls in any denoising step. :meth:`unmerge_lora` undoes it; train and save unmerged."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        for module in self.transformer.modules():
            if isinstance(module, BaseTunerLayer) and not module.merged:
                module.merge()

    def unmerge_lora(self) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        for module in self.transformer.modules():
            if isinstance(module, BaseTunerLayer) and module.merged:
                module.unmerge()

    def compile_blocks(self, **compile_kwargs) -> None:
        """``torch.compile`` every transformer block in place (``compile_kwargs`` go to torch.compile).

        Regional compilation: one block graph, compiled once and reused by all layers, so start-up takes seconds;
        the sampling loop, scheduler and CFG arithmetic stay eager and readable.
        """
        for block in self.transformer.transformer_blocks:
            block.compile(**compile_kwargs)

    def compile_vae(self, **compile_kwargs) -> None:
        """``torch.compile`` the VAE's decoder in place (``compile_kwargs`` go to torch.compile).

        The first decode compiles (once per frame-chunk shape; VAE tiling changes the shapes and compiles again),
        so it pays for a long game, not for one clip; its times are in docs/performance.md.
        """
        self._need_vae().decoder.compile(**compile_kwargs)

    # ------------------------------------------------------------------ model

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.proj_out.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.transformer.proj_out.weight.device

    @property
    def num_condition_tokens(self) -> int:
        return self.transformer.config.max_text_seq_length

    @property
    def prediction_type(self) -> str:
        return self.scheduler_config.get("prediction_type", "epsilon")

    @property
    def hidden_size(self) -> int:
        tcfg = self.transformer.config
        return tcfg.num_attention_heads * tcfg.attention_head_dim

    def null_shot_embeds(self, batch_size: int, device=None, dtype=torch.float32) -> torch.Tensor:
        """The unconditional shot representation used by CFG and condition dropout (B, N, H): zeros, or for a
        checkpoint's own unconditional tokens (a converted release's: its fusion of zero T5 and CLIP)."""
        device = device or self.device
        if self.null_shot is not None:
            return self.null_shot.to(device=device, dtype=dtype).expand(batch_size, -1, -1)
        return torch.zeros(batch_size, self.num_condition_tokens, self.hidden_size, device=device, dtype=dtype)

    def motion_inputs(self, motion_level: torch.Tensor) -> torch.Tensor:
        """What the motion embedding sees for levels (B,): the level itself, or a converted release's flow value."""
        if self.motion_values is None:
            return motion_level
        table = torch.tensor(self.motion_values, device=motion_level.device)
        return table[(motion_level.long() - 1).clamp(0, len(self.motion_values) - 1)]

    def drop_conditions(
        self, shot_embeds: torch.Tensor, motion_level: torch.Tensor | None, dropped: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Condition dropout for CFG: rows where ``dropped`` (B,) is true get the null s_a, and with
        ``motion_guidance`` the null level as well. Returns (s_a (B, N, H), levels (B,) or None)."""
        null = self.null_shot_embeds(shot_embeds.shape[0], shot_embeds.device, shot_embeds.dtype)
        shot_embeds = torch.where(dropped[:, None, None], null, shot_embeds)
        if self.motion_guidance and motion_level is not None:
            motion_level = torch.where(dropped.to(motion_level.device), NULL_MOTION_LEVEL, motion_level)
        return shot_embeds, motion_level

    def unconditional_levels(self, motion_level: torch.Tensor | None) -> torch.Tensor | None:
        """The levels of CFG's unconditional branch: the null level with ``motion_guidance``, else the same ones."""
        if self.motion_guidance and motion_level is not None:
            return torch.full_like(motion_level, NULL_MOTION_LEVEL)
        return motion_level

    def forward(
        self,
        noisy_latents: torch.Tensor,
        timesteps: torch.Tensor,
        shot_embeds: torch.Tensor,
        motion_level: torch.Tensor | None = None,
        motion_value: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, F, C, h, w) noisy latents at ``timesteps`` (B,), s_a (B, N, H), levels (B,) -> model output.

        ``motion_value`` (B,) feeds the motion embedding directly instead of the levels (e.g. a release flow value).
        """
        if shot_embeds.shape[1] != self.num_condition_tokens:
            raise ValueError(
                f"shot_embeds has {shot_embeds.shape[1]} tokens; the decoder expects {self.num_condition_tokens}"
            )
        ofs = None
        if self.motion_scope:
            if motion_value is None and motion_level is None:
                raise ValueError("this decoder injects the motion level; pass motion_level (B,) in 1..5 (0: null)")
            ofs = motion_value if motion_value is not None else self.motion_inputs(motion_level)
            ofs = ofs.to(noisy_latents.device)
        out = self.transformer(
            hidden_states=noisy_latents.to(self.dtype),
            encoder_hidden_states=shot_embeds.to(self.dtype),
            timestep=timesteps,
            ofs=ofs,
            return_dict=False,
        )[0]
        return out.float()

    def training_target(self, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """What the model output is regressed on, from the scheduler's ``prediction_type`` (v for CogVideoX-2B)."""
        if self.prediction_type == "v_prediction":
            return self.noise_scheduler.get_velocity(latents, noise, timesteps)
        if self.prediction_type == "epsilon":
            return noise
        if self.prediction_type == "sample":
            return latents
        raise ValueError(f"unsupported prediction_type {self.prediction_type!r}")

    # ------------------------------------------------------------------ video <-> latents

    def _need_vae(self):
        if self.vae is None:
            raise RuntimeError("this decoder was built without its VAE (with_vae=False)")
        return self.vae

    def encode_video(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 (B, T, H, W, 3) -> scaled latents (B, F, C, h, w)."""
        return vae_encode(self._need_vae(), frames)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents (B, F, C, h, w) -> uint8 (B, T, H, W, 3)."""
        return vae_decode(self._need_vae(), latents)

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """(F, C, h, w) of a clip of ``num_frames`` frames at ``height`` x ``width``."""
        vcfg = self._need_vae().config
        temporal = int(vcfg.temporal_compression_ratio)
        spatial = 2 ** (len(vcfg.block_out_channels) - 1)
        if (num_frames - 1) % temporal or height % spatial or width % spatial:
            raise ValueError(
                f"{num_frames} frames at {height}x{width}: need frames = {temporal}k + 1 and sizes divisible by "
                f"{spatial}"
            )
        return (
            (num_frames - 1) // temporal + 1,
            self.transformer.config.in_channels,
            height // spatial,
            width // spatial,
        )
