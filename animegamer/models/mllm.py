"""AnimeGamerMLLM: Mistral + LoRA that predicts the next game state (shot representation + state values).

One training sequence (:class:`animegamer.tokens.TurnLayout`; one turn is drawn in ``animegamer/tokens.py``)::

    <s> <TURN> instr <VS> [226 slots] </VS> <MS><level_k></MS> <SC>..</SC> <ET>..</ET> <ST>..</ST> </TURN>  x K history
        <TURN> instr <VS> [226 slots] </VS> <MS><level_k></MS> ...                                   </TURN>  current

    history slots   <- input_resampler(s_a of that shot)               (M, N, shot_dim) -> (M, N, hidden)
    current slots   <- the slot tokens' own embeddings = learnable queries <ANIME_0> ... <ANIME_{N-1}>
    output_resampler(final hidden states at the current slots) -> predicted s_a (Q, N, shot_dim)   [MSE, cosine]
        (+ the last history shot with shot_residual "previous": the resampler then gives the change)
    the token before each current value token predicts it                                       [cross-entropy]

Trained: LoRA (peft, r/alpha/targets from :class:`MLLMConfig`), the rows of the added special tokens (input embedding
and output head), both resamplers. Frozen: everything of the base model, including its 32k-row embedding and head.
The added tokens' rows live in their own small ``new_token_embed`` / ``new_token_head`` (ids ``base_vocab`` and up)
instead of a resized base matrix, so only they train and only they are saved; logits over the whole vocabulary are
``cat(lm_head(h)[:base_vocab], new_token_head(h))``.

``save_trained(dir)`` writes::

    adapter_config.json, adapter_model.safetensors   the LoRA, in peft's adapter format
    mllm_trained.safetensors                          new_token_embed, new_token_head, input/output resamplers
    mllm_layout.json                                  vocabulary, num_slots, base_vocab, widths (checked on load);
                                                      slot_attention (adopted on load, absent: causal);
                                                      shot_residual (adopted on load, absent: none); the
                                                      resampler depth and K, read by config.recorded
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from animegamer.config import MLLMConfig
from animegamer.config.recorded import MLLM_LAYOUT as LAYOUT_FILE  # where config.recorded reads shape and K
from animegamer.io import atomic_write_json, read_json_bounded, resolve_checkpoint
from animegamer.models.mllm_tokenizer import load_tokenizer
from animegamer.models.resampler import ShotResampler
from animegamer.models.weights import load_state_dict_file, save_state_dict_file, sort_adapter_targets
from animegamer.tokens import IGNORE_INDEX, STATE_FIELDS, TurnLayout, get_vocabulary

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TRAINED_FILE = "mllm_trained.safetensors"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
LAYOUT_DEFAULTS = {"resampler_gelu": "tanh"}  # layout keys that checkpoints written before them lack
SLOT_ATTENTION = ("causal", "bidirectional")  # mllm_layout.json's slot_attention (absent: causal)
SHOT_RESIDUAL = ("none", "previous")  # mllm_layout.json's shot_residual (absent: none)


def full_weight(weight: torch.Tensor) -> torch.Tensor:
    """A float32 copy of ``weight``'s full value. Under DeepSpeed ZeRO-3 (transformers builds a model inside
    ``deepspeed.zero.Init`` whenever accelerate's ZeRO-3 config is active, whatever its ``zero3_init_flag``) a
    parameter outside a forward pass is an empty placeholder (shape 0, its values sharded over the processes):
    statistics of it would be NaN, so it is gathered on every process (a collective) for the copy."""
    if hasattr(weight, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([weight], modifier_rank=None):
            return weight.detach().float().clone()
    return weight.detach().float()


class AnimeGamerMLLM(nn.Module):
    def __init__(
        self,
        llm: nn.Module,
        tokenizer: Any,
        base_vocab: int,
        vocabulary: str = "paper",
        num_slots: int = 226,
        shot_dim: int = 1920,
        resampler_layers: int = 2,
        resampler_gelu: str = "tanh",
        lora_rank: int = 32,
        lora_alpha: int = 32,
        lora_dropout: float = 0.05,
        lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        gradient_checkpointing: bool = False,
    ):
        """``llm``: a ``MistralForCausalLM`` without adapters; ``tokenizer`` from :func:`load_tokenizer`."""
        from peft import LoraConfig, get_peft_model

        super().__init__()
        self.tokenizer = tokenizer
        self.vocabulary, self.num_slots, self.shot_dim = vocabulary, num_slots, shot_dim
        self.layout = TurnLayout(tokenizer, get_vocabulary(vocabulary), num_slots)
        self.base_vocab = base_vocab
        num_new = len(tokenizer) - base_vocab
        hidden = llm.config.hidden_size
        self.hidden_size = hidden
        # how the current turn's slots attend to each other: "causal" (this project's training) or "bidirectional"
        # (one block that sees itself whole, as the released weights were trained); a checkpoint records it
        self.slot_attention = "causal"
        self.kv_cache = "static"  # the turn's KV cache (animegamer.models.mllm_turn): static | dynamic (mllm.kv_cache)
        # what the output resampler gives: the shot ("none") or its change from the last history shot ("previous",
        # added back in predict_shots); stage (b) sets it from mllm.shot_residual, a checkpoint records it
        self.shot_residual = "none"

        llm.requires_grad_(False)
        if gradient_checkpointing:
            llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        llm.config.use_cache = False
        lora = LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=list(lora_targets),
            bias="none",
            task_type="CAUSAL_LM",
        )
        with warnings.catch_warnings():
            # peft 0.21.2 (the newest) reads transformers' deprecated `is_gradient_checkpointing` alias in
            # get_peft_model, which warned at every start; the value it reads is right, only the name is old
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            self.llm = get_peft_model(llm, lora)

        # New rows start as "a typical token": the mean of the base rows plus noise of the base rows' spread (as
        # transformers' resize does), so slot queries differ from each other and value logits are not all tied.
        base_in = full_weight(llm.get_input_embeddings().weight)
        base_out = full_weight(llm.get_output_embeddings().weight)[:base_vocab]
        self.new_token_embed = nn.Embedding(num_new, hidden)
        self.new_token_head = nn.Linear(hidden, num_new, bias=False)
        with torch.no_grad():
            self.new_token_embed.weight.copy_(base_in.mean(0) + base_in.std(0) * torch.randn(num_new, hidden))
            self.new_token_head.weight.copy_(base_out.mean(0) + base_out.std(0) * torch.randn(num_new, hidden))
        self.resampler_gelu, self.resampler_layers = resampler_gelu, resampler_layers
        self.input_resampler = ShotResampler(shot_dim, hidden, resampler_layers, resampler_gelu)
        self.output_resampler = ShotResampler(hidden, shot_dim, resampler_layers, resampler_gelu)
        self._value_columns = {
            f: torch.tensor([i - base_vocab for i in self.layout.value_ids[f]]) for f in STATE_FIELDS
        }
        self._on_device: dict[tuple[str, str, torch.device], torch.Tensor] = {}  # see device_table

    @classmethod
    def from_config(
        cls, cfg: MLLMConfig, device: str | torch.device | None = None, tokenizer: tuple[Any, int] | None = None,
    ) -> AnimeGamerMLLM:
        """Load the base model and tokenizer from ``cfg.pretrained`` and add fresh (seeded by the caller) parts.
        ``tokenizer``: :func:`load_tokenizer`'s (tokenizer, base vocabulary size) for ``cfg``, where the caller has
        it already (stage (b) lays its data out with it before the model loads)."""
        from transformers import MistralForCausalLM

        tokenizer, base_vocab = tokenizer or load_tokenizer(cfg.pretrained, cfg.vocabulary, cfg.num_slots)
        llm = MistralForCausalLM.from_pretrained(
            cfg.pretrained, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation
        )
        model = cls.from_modules(cfg, llm, tokenizer, base_vocab)
        if device is not None:
            model.to(device)
        return model

    @classmethod
    def from_modules(
        cls, cfg: MLLMConfig, llm: nn.Module, tokenizer, base_vocab: int, shot_dim: int | None = None,
    ) -> AnimeGamerMLLM:
        """Wrap an already-built causal LM + tokenizer with the settings of ``cfg`` (``shot_dim`` overrides
        ``cfg.shot_dim``; the benchmark builds random full-size models on the GPU this way)."""
        model = cls(
            llm,
            tokenizer,
            base_vocab,
            vocabulary=cfg.vocabulary,
            num_slots=cfg.num_slots,
            shot_dim=shot_dim if shot_dim is not None else cfg.shot_dim,
            resampler_layers=cfg.resampler_layers,
            resampler_gelu=cfg.resampler_gelu,
            lora_rank=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            lora_targets=tuple(cfg.lora_targets),
            gradient_checkpointing=cfg.gradient_checkpointing,
        )
        model.kv_cache = cfg.kv_cache
        model.shot_residual = cfg.shot_residual
        return model

    # ------------------------------------------------------------------ building blocks (also used by inference)

    @property
    def backbone(self) -> nn.Module:
        """The base transformer (``MistralModel``: its layer stack) with the LoRA layers injected."""
        return self.llm.get_base_model().model

    @property
    def device(self) -> torch.device:
        return self.new_token_head.weight.device

    def embed(
        self,
        input_ids: torch.Tensor,
        history_positions: torch.Tensor | None = None,
        history_shots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Input embeddings (B, T, hidden) of token ids, with history shots written into their slots.

        ``history_positions`` (M, N) index the flattened (B*T) sequence; ``history_shots`` (M, N, shot_dim).
        """
        base_embed = self.llm.get_input_embeddings()
        is_new = (input_ids >= self.base_vocab).unsqueeze(-1)  # (B, T, 1)
        base = base_embed(input_ids.clamp(max=self.base_vocab - 1))  # (B, T, hidden), frozen rows
        new = self.new_token_embed((input_ids - self.base_vocab).clamp(min=0))  # (B, T, hidden), trained rows
        embeds = torch.where(is_new, new.to(base.dtype), base)
        if history_shots is None:
            return embeds
        batch, length, hidden = embeds.shape
        # Run the resampler even on an empty (0, N, D) batch so every trained parameter takes part in backward
        # (DDP expects that) whether or not this batch has history turns.
        shots = self.input_resampler(history_shots)  # (M, N, hidden)
        flat = embeds.reshape(batch * length, hidden)  # (B*T, hidden)
        flat = flat.index_copy(0, history_positions.reshape(-1), shots.reshape(-1, hidden).to(flat.dtype))
        return flat.view(batch, length, hidden)

    def transformer(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """Final (normed) hidden states (B, T, hidden) and the KV cache (when ``use_cache``).

        Packed rows pass ``attention_mask=None`` and ``position_ids`` restarting at 0 per sequence; transformers
        then keeps the sequences of a row from attending to each other.
        """
        dtype = self.llm.get_input_embeddings().weight.dtype
        out = self.backbone(
            inputs_embeds=inputs_embeds.to(dtype),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        return out.last_hidden_state, out.past_key_values

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the whole extended vocabulary (..., base_vocab + new tokens), float32."""
        head = self.llm.get_output_embeddings()
        base = head(hidden.to(head.weight.dtype))[..., : self.base_vocab]
        new = self.new_token_head(hidden.to(self.new_token_head.weight.dtype))
        return torch.cat([base.float(), new.float()], dim=-1)

    def value_logits(self, hidden: torch.Tensor, field: str) -> torch.Tensor:
        """Logits of ``field``'s value tokens only (..., num_values), float32: ``token_logits`` at those ids.

        Every value token is an added token, so only the small new head runs.
        """
        new = self.new_token_head(hidden.to(self.new_token_head.weight.dtype)).float()
        return new[..., self.device_table("columns", field, new.device)]

    def device_table(self, kind: str, field: str, device: torch.device | str) -> torch.Tensor:
        """A small constant id table on ``device``, copied there once per device and kept: ``columns`` (``field``'s
        value tokens as columns of the new-token head), ``values`` (their token ids) or ``step`` (``field``'s close
        tag and the next field's open tag). A copy from host memory makes the host wait for the GPU's queue, so
        state decoding, which runs mid-turn, must not make one per field."""
        device = torch.device(device)
        key = (kind, field, device)
        if key not in self._on_device:
            layout = self.layout
            if kind == "columns":
                table = self._value_columns[field]
            elif kind == "values":
                table = torch.tensor(layout.value_ids[field])
            elif kind == "step":
                following = STATE_FIELDS[STATE_FIELDS.index(field) + 1]
                table = torch.tensor([layout.close_ids[field], layout.open_ids[following]])
            else:
                raise ValueError(f"unknown table kind {kind!r}: columns | values | step")
            self._on_device[key] = table.to(device)
        return self._on_device[key]

    def predict_shots(self, slot_hidden: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states at a turn's slots (..., N, hidden) -> predicted s_a (..., N, shot_dim), float32.

        ``previous``: the shot of the turn's last history turn (..., N, shot_dim), None without history. A model with
        ``shot_residual`` "previous" adds it to the output resampler's result (which is then the shot's change);
        with "none" (the paper) it is not read."""
        shots = self.output_resampler(slot_hidden).float()
        if self.shot_residual == "previous" and previous is not None:
            shots = shots + previous.to(shots.device).float()
        return shots

    # ------------------------------------------------------------------ fast path

    def merge_lora(self) -> None:
        """Fold the LoRA into the base weights (inference): the same outputs up to the weights' rounding, without
        the per-layer LoRA matmuls. :meth:`unmerge_lora` undoes it; train and save unmerged."""
        self.llm.merge_adapter()

    def unmerge_lora(self) -> None:
        self.llm.unmerge_adapter()

    def compile_blocks(self, **compile_kwargs) -> None:
        """``torch.compile`` every decoder layer in place (regional compilation; ``compile_kwargs`` go to
        torch.compile). Meant for training, where every step has the same shapes."""
        for layer in self.backbone.layers:
            layer.compile(**compile_kwargs)

    # ------------------------------------------------------------------ training

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the model predicts for a collated stage (b) batch (animegamer.data.stage_b), teacher-forced:
        ``value_logits`` (V, vocab) at the V current value tokens (the token before each predicts it),
        ``value_labels`` (V,) their true tokens and ``shots`` (Q, N, shot_dim) the predicted s_a of the Q current
        turns. The loss is the recipe's (animegamer.training.losses.stage_b_loss)."""
        input_ids = batch["input_ids"]
        rows, length = input_ids.shape
        embeds = self.embed(input_ids, batch["history_positions"], batch["history_shots"])
        hidden, _ = self.transformer(
            embeds, attention_mask=batch.get("attention_mask"), position_ids=batch.get("position_ids")
        )
        flat = hidden.reshape(rows * length, -1)  # (R*T, hidden)

        labels = batch["labels"].reshape(-1)
        at = (labels != IGNORE_INDEX).nonzero().squeeze(-1)  # flat positions of the current value tokens
        logits = self.token_logits(flat[at - 1])  # (V, vocab): the token before a value token predicts it
        shots = self.predict_shots(flat[batch["query_positions"]], self.previous_shots(batch))  # (Q, N, shot_dim)
        return {"value_logits": logits, "value_labels": labels[at], "shots": shots}

    def previous_shots(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """(Q, N, shot_dim): each current turn's last history shot as the batch holds it (``previous_index``, -1:
        none, then zeros), for ``shot_residual`` "previous"; None for "none" or a batch without history."""
        history = batch["history_shots"]
        if self.shot_residual != "previous" or history.shape[0] == 0:
            return None
        index = batch["previous_index"].to(history.device)  # (Q,)
        has = (index >= 0).to(history.dtype)[:, None, None]
        return history[index.clamp(min=0)] * has

    def trained_names(self) -> list[str]:
        """Names of the trained parameters (LoRA, new token rows, resamplers), as in ``state_dict()``."""
        return [n for n, p in self.named_parameters() if p.requires_grad]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ saving

    def _layout_meta(self) -> dict[str, Any]:
        return {
            "vocabulary": self.vocabulary,
            "num_slots": self.num_slots,
            "base_vocab": self.base_vocab,
            "num_new_tokens": self.new_token_embed.num_embeddings,
            "hidden_size": self.hidden_size,
            "shot_dim": self.shot_dim,
            "resampler_gelu": self.resampler_gelu,
        }

    def save_trained(self, out_dir: str | Path, state_dict: dict[str, torch.Tensor] | None = None,
                     history_turns: int | None = None) -> Path:
        """Write the trained parts into ``out_dir`` (see module docstring); ``history_turns``: the K trained with.

        ``state_dict``: a full state dict gathered by ``accelerator.get_state_dict`` (ZeRO-3, FSDP), where this
        module's own parameters are only shards; by default the module's own parameters are used.
        """
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = state_dict if state_dict is not None else self.state_dict()
        names = self.trained_names()
        missing = [n for n in names if n not in state]
        if missing:
            raise KeyError(f"the state dict lacks {len(missing)} trained tensors, e.g. {missing[0]}")
        adapter = {n[len("llm.") :]: state[n] for n in names if n.startswith("llm.")}
        self.llm.save_pretrained(str(out_dir), state_dict=adapter, safe_serialization=True)
        sort_adapter_targets(out_dir)
        (out_dir / "README.md").unlink(missing_ok=True)  # peft's model-card template says nothing useful here
        extras = {n: state[n] for n in names if not n.startswith("llm.")}
        layout = {**self._layout_meta(), "resampler_layers": self.resampler_layers}
        if self.slot_attention != "causal":
            layout["slot_attention"] = self.slot_attention
        if self.shot_residual != "none":
            layout["shot_residual"] = self.shot_residual
        if history_turns is not None:
            layout["history_turns"] = history_turns
        save_state_dict_file(extras, out_dir / TRAINED_FILE, metadata={"layout": json.dumps(layout)})
        atomic_write_json(out_dir / LAYOUT_FILE, layout)
        return out_dir

    def load_trained(self, path: str | Path) -> Path:
        """Load what :meth:`save_trained` wrote (a step dir, a run dir or ``checkpoints/latest``); returns the dir."""
        from peft import set_peft_model_state_dict

        path = resolve_checkpoint(path)
        for name in (*ADAPTER_FILES, TRAINED_FILE, LAYOUT_FILE):
            if not os.path.lexists(path / name):  # a pipe or a device there: refused by its reader, by name
                raise FileNotFoundError(f"{path} is not an MLLM checkpoint: {name} is missing")
        saved = read_json_bounded(path / LAYOUT_FILE)  # a damaged one: a ValueError naming it
        if not isinstance(saved, dict):
            raise ValueError(f"{path / LAYOUT_FILE}: not an MLLM layout (a JSON object expected)")
        mine = self._layout_meta()
        saved = {**LAYOUT_DEFAULTS, **saved}
        diff = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: checkpoint {a!r} vs model {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"{path / LAYOUT_FILE}: checkpoint does not fit this model ({detail})")
        adapter_cfg = read_json_bounded(path / "adapter_config.json")
        if not isinstance(adapter_cfg, dict):
            raise ValueError(f"{path / 'adapter_config.json'}: not a LoRA adapter config (a JSON object expected)")
        lora = self.llm.peft_config["default"]
        want = {"r": lora.r, "lora_alpha": lora.lora_alpha, "target_modules": sorted(lora.target_modules)}
        have = {k: adapter_cfg.get(k) for k in want}
        have["target_modules"] = sorted(have["target_modules"] or [])
        if have != want:
            raise ValueError(f"{path}: LoRA settings {have} differ from the model's {want} (mllm.lora_*)")

        result = set_peft_model_state_dict(self.llm, load_state_dict_file(path / "adapter_model.safetensors"))
        lora_missing = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or lora_missing:
            raise ValueError(
                f"{path}: adapter weights do not match (unexpected {result.unexpected_keys[:3]}, "
                f"missing {lora_missing[:3]})"
            )
        extras = load_state_dict_file(path / TRAINED_FILE)
        expected = {n for n in self.trained_names() if not n.startswith("llm.")}
        if set(extras) != expected:
            raise ValueError(f"{path}: {TRAINED_FILE} holds {sorted(set(extras) ^ expected)[:4]} unexpectedly")
        self.load_state_dict(extras, strict=False)
        # converted before the layout named its slot attention, a release checkpoint said "official": true
        slot_attention = saved.get("slot_attention", "bidirectional" if saved.get("official") else "causal")
        if slot_attention not in SLOT_ATTENTION:
            raise ValueError(f"{path}: slot_attention {slot_attention!r} is not one of {list(SLOT_ATTENTION)}")
        self.slot_attention = slot_attention
        shot_residual = saved.get("shot_residual", "none")
        if shot_residual not in SHOT_RESIDUAL:
            raise ValueError(f"{path}: shot_residual {shot_residual!r} is not one of {list(SHOT_RESIDUAL)}")
        self.shot_residual = shot_residual
        return path
