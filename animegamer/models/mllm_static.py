"""The MLLM's turn without the host in the way: fixed-size KV buffers, explicit positions and masks, one transfer.

    model.kv_cache = "static"                                    # the default (mllm.kv_cache)
    prediction = predict_turn(model, history, instruction)      # animegamer.models.mllm_turn, as ever
    hidden, cache = prefill_static(model, seq.input_ids, seq.slot_positions[:-1], shots)   # the parts: (T, hidden)
    choices, probs = decode_static(model, hidden[-1], cache)                               # still on the device

The same computation as :func:`animegamer.models.mllm_turn.prefill_turn` + :func:`decode_states` with transformers'
dynamic cache, arranged so that a GPU never waits for the host between the instruction and the result:

- the KV cache is one set of preallocated buffers per model (:func:`new_fixed_cache`, ``(1, kv_heads, L, head_dim)``
  per layer; ``L`` the prompt plus the state tokens rounded up to 64, grown when a longer prompt comes, never per
  turn), written at explicit positions with ``index_copy_``: no per-layer host scalar, no growth by concatenation;
- the prefill runs under transformers' own mask, sized by the prompt (so the same attention kernels as the dynamic
  cache's prefill); every state step gets its positions and a boolean (1, 1, 3, L) mask built on the device
  (causal, and Mistral's sliding window when the config has one), so no cache length is read on the host;
- the state steps have fixed shapes (3 tokens against all ``L`` keys) and read the prompt length from a device
  scalar written by the prefill: no ``.item()``, no shape that depends on values, no Python branch on a tensor
  between the prefill and the result, so the steps can be captured in a CUDA graph
  (``torch.compile(mode="reduce-overhead")``: :func:`compile_static_turn`);
- the prompt goes to the device from pinned memory without blocking, and the shot, the chosen values and their
  probabilities come back in one transfer (the turn's one host synchronisation).

``compile_static_turn(model)`` compiles the prefill (dynamic prompt length) and the state steps (static shapes).
The state decoding stays three dependent steps of 3 tokens: one tree-masked forward over every path to the last
field would take 5 + 5·2 + 5·2·2 = 35 branches of 3 tokens (105 tokens) for the 9 the chosen path needs.
"""

from __future__ import annotations

import math
import weakref

import torch

from animegamer.tokens import STATE_FIELDS

ROUND_TO = 64  # KV buffer lengths are multiples of this: few reallocations, aligned kernels
STEP_TOKENS = 3  # value, close tag, next open tag
_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its fixed cache
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (prefill fn, steps fn)


def buffer_length(prompt_tokens: int) -> int:
    """KV buffer length for a prompt: the prompt and every state step, rounded up to :data:`ROUND_TO`."""
    needed = prompt_tokens + STEP_TOKENS * (len(STATE_FIELDS) - 1)
    return math.ceil(needed / ROUND_TO) * ROUND_TO


def new_fixed_cache(num_layers: int, length: int):
    """Preallocated keys/values of every layer (``length`` positions), written at the positions in ``write_at``.

    A transformers ``Cache`` (its classes made here: transformers is imported where a model runs): ``update``
    copies the new keys/values into the buffers at ``write_at`` and returns their first ``visible`` positions (the
    prompt during the prefill, all ``length`` during the state steps, so that those have fixed shapes)."""
    from transformers.cache_utils import Cache, StaticLayer

    class _Layer(StaticLayer):
        def __init__(self, owner, max_cache_len: int):
            super().__init__(max_cache_len)
            self.owner = owner

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            at = self.owner.write_at
            self.keys.index_copy_(2, at, key_states)
            self.values.index_copy_(2, at, value_states)
            visible = self.owner.visible
            return self.keys[:, :, :visible], self.values[:, :, :visible]

        # what transformers sizes its own mask by, in the prefill (the steps pass theirs): the prompt from position 0
        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.owner.visible, 0

        def get_seq_length(self) -> int:
            return 0

    class _Cache(Cache):
        def __init__(self):
            self.length = length
            self.write_at: torch.Tensor | None = None  # (q,) positions of the tokens of the running forward
            self.visible = length
            self.prompt_length: torch.Tensor | None = None  # () int64 on the device, set by the prefill
            super().__init__(layers=[_Layer(self, length) for _ in range(num_layers)])

    return _Cache()


def is_fixed(cache) -> bool:
    """Whether ``cache`` is a fixed cache of this module (a static prefill's)."""
    return getattr(cache, "prompt_length", None) is not None


def fixed_cache(model, prompt_tokens: int):
    """The model's KV buffers, (re)allocated when this prompt does not fit."""
    cache = _CACHES.get(model)
    dtype = model.llm.get_input_embeddings().weight.dtype
    if (cache is None or cache.length < buffer_length(prompt_tokens) or cache.prompt_length.device != model.device
            or cache.dtype != dtype):  # a longer prompt, or the model moved or was cast since
        config = model.llm.config
        cache = new_fixed_cache(config.num_hidden_layers, buffer_length(prompt_tokens))
        cache.prompt_length = torch.zeros((), dtype=torch.long, device=model.device)
        cache.dtype = dtype
        # allocated now, outside any compiled region: only then are the buffers marked as static addresses, which
        # CUDA graphs need of inputs they write into
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        empty = torch.empty(1, config.num_key_value_heads, 0, head_dim, dtype=dtype, device=model.device)
        for layer in cache.layers:
            layer.lazy_initialization(empty, empty)
        _CACHES[model] = cache
    return cache


def release_fixed_cache(model) -> None:
    """Free the model's KV buffers (they stay allocated between turns, also while an offloaded model is away)."""
    _CACHES.pop(model, None)


def attention_mask(positions: torch.Tensor, keys: int, window: int | None) -> torch.Tensor:
    """(1, 1, q, keys) boolean mask: query at ``positions[i]`` sees keys ``j <= positions[i]`` (and, with a sliding
    ``window``, ``j > positions[i] - window``, as transformers' Mistral masks it)."""
    key_pos = torch.arange(keys, device=positions.device)
    query = positions[:, None]
    mask = key_pos[None, :] <= query
    if window is not None:
        mask = mask & (key_pos[None, :] > query - window)
    return mask[None, None]


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor -> ``device`` without making the host wait: pinned, non-blocking on a GPU (a tensor already on a
    GPU is moved as it is)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device, non_blocking=True)


def _forward(model, embeds: torch.Tensor, positions: torch.Tensor, cache, visible: int,
             mask: torch.Tensor | None) -> torch.Tensor:
    """Final hidden states (1, q, hidden) of ``embeds`` at ``positions`` (q,), written into ``cache`` there and
    attending to its first ``visible`` positions under ``mask`` (None: transformers' causal, windowed mask)."""
    cache.write_at, cache.visible = positions, visible
    hidden, _ = model.transformer(embeds, attention_mask=mask, position_ids=positions[None], past_key_values=cache,
                                  use_cache=True)
    return hidden


def _prefill(model, embeds: torch.Tensor, cache) -> torch.Tensor:
    """The prompt from position 0 under transformers' own mask, as the dynamic cache's prefill runs (the same
    kernels: on a plain causal prompt SDPA's causal path, which skips the blocks above the diagonal)."""
    length = embeds.shape[1]
    return _forward(model, embeds, torch.arange(length, device=embeds.device), cache, length, None)


def state_steps(model, last: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """Every state field's choice (F,) (index among its values) and the probabilities of all values, concatenated
    in field order, from ``last`` (the hidden state at the first field's open tag) and the prefilled ``cache``.

    Fixed shapes and device-side control only (module docstring): capturable as one CUDA graph."""
    choices, dists = [], []
    steps = torch.arange(STEP_TOKENS, device=last.device)
    for i, name in enumerate(STATE_FIELDS):
        logits = model.value_logits(last, name)  # (num_values,)
        choices.append(logits.argmax())
        dists.append(logits.softmax(-1))
        if i + 1 == len(STATE_FIELDS):
            break
        value_ids = model.device_table("values", name, last.device)
        tags = model.device_table("step", name, last.device)
        step = torch.cat([value_ids.index_select(0, choices[-1].view(1)), tags])[None]  # (1, 3)
        positions = cache.prompt_length + STEP_TOKENS * i + steps
        mask = attention_mask(positions, cache.length, model.backbone.config.sliding_window)
        last = _forward(model, model.embed(step), positions, cache, cache.length, mask)[0, -1]
    return torch.stack(choices), torch.cat(dists)


def prefill_static(model, input_ids: list[int], slot_positions: list[list[int]] | None,
                   history_shots: list[torch.Tensor]) -> tuple[torch.Tensor, object]:
    """Final hidden states (T, hidden) of one prompt (``input_ids``; history slots at ``slot_positions`` carrying
    ``history_shots``, each (N, shot_dim), on the host or the device), its keys/values kept in the model's
    fixed cache (:func:`fixed_cache`), which is returned."""
    device = model.device
    cache = fixed_cache(model, len(input_ids))
    ids = to_device(torch.tensor([input_ids]), device)  # (1, T)
    if history_shots:
        positions = to_device(torch.tensor(slot_positions), device)  # (M, N)
        shots = torch.stack([to_device(s, device) for s in history_shots])  # (M, N, D)
        embeds = model.embed(ids, positions, shots)
    else:
        embeds = model.embed(ids)
    cache.prompt_length.fill_(len(input_ids))  # read on the device by the state steps
    prefill, _ = _COMPILED.get(model, (_prefill, None))
    return prefill(model, embeds, cache)[0], cache


def decode_static(model, last: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`state_steps`, compiled when :func:`compile_static_turn` was called for ``model``."""
    _, steps = _COMPILED.get(model, (None, state_steps))
    return steps(model, last, cache)


def to_host(*parts: torch.Tensor) -> list[torch.Tensor]:
    """``parts`` as float32 on the host in one transfer (one host synchronisation for all of them)."""
    flat = torch.cat([p.detach().reshape(-1).float() for p in parts]).cpu()
    out, offset = [], 0
    for p in parts:
        out.append(flat[offset : offset + p.numel()].view(p.shape))
        offset += p.numel()
    return out


def compile_static_turn(model, mode: str | None = None, **compile_kwargs) -> None:
    """``torch.compile`` the static turn of ``model``: the prefill with a dynamic prompt length, the state steps
    with static shapes (``mode`` for them, e.g. ``"reduce-overhead"``: CUDA graphs on a GPU). ``compile_kwargs``
    (``backend``, ...) go to both."""
    steps_kwargs = {**compile_kwargs, **({"mode": mode} if mode else {})}
    _COMPILED[model] = (
        torch.compile(_prefill, dynamic=True, **compile_kwargs),
        torch.compile(state_steps, dynamic=False, **steps_kwargs),
    )


def uncompile_static_turn(model) -> None:
    """Back to the eager static turn."""
    _COMPILED.pop(model, None)
