"""The MLLM's turn: one prefill, then the four state values decoded from its KV cache.

    prediction = predict_turn(model, history, "Character: Qiqi; Motion: gently lie down; Background: park.")

``predict_turn(model, history, instruction) -> TurnPrediction`` uses the history exactly as given (the game windows
it: :meth:`animegamer.game.turn.AnimeGamer.play_turn`):

1. prefill ``<s> [history turns] <TURN> instruction <VS> slots </VS> <MS>`` once: the hidden states at the current
   slots go through the output resampler (-> ``shot_embeds`` (N, shot_dim)); the KV cache is kept.
2. for each state field in order, the logits of that field's value tokens only are read at the last position and
   the argmax is taken, so every turn yields valid values; then ``<value> </MS> <SC>`` (the chosen value, the
   close tag and the next open tag) are fed through the cache, and so on. There is no fallback value.

The two steps are also callable apart (:func:`prefill_turn`, :func:`decode_states`); the speed harness times them.
The KV cache is the model's ``kv_cache`` (``mllm.kv_cache``): ``static`` (the default: fixed buffers, state steps
with fixed shapes, one transfer to the host per turn; animegamer.models.mllm_static) or ``dynamic`` (transformers'
cache, grown per token). Both give the same values and, in fp32, the same shot.
A model whose checkpoint records ``slot_attention: bidirectional`` (converted release weights, trained so) reads its
shot from a second pass in which the current turn's slots attend to each other (:func:`slot_block_shots`). Another
turn function (:data:`TurnFunction`) plays the same game: the release's own turn lives in
animegamer/official/agent.py. Used by the game (animegamer.game), stage (c)'s own-history targets
(animegamer.data.stage_c) and the speed harness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from animegamer.models.mllm_static import decode_static, is_fixed, prefill_static, to_host
from animegamer.states import StateValues
from animegamer.tokens import STATE_FIELDS, SequenceLayout, TurnSpec


@dataclass
class HistoryTurn:
    """An earlier turn as the MLLM sees it."""

    instruction: str
    shot_embeds: torch.Tensor  # (N, shot_dim)
    values: StateValues


@dataclass
class TurnPrediction:
    """What the MLLM predicts for one turn."""

    shot_embeds: torch.Tensor  # (N, shot_dim) float32, CPU
    values: StateValues
    prompt_tokens: int  # length of the prefilled prompt
    value_probs: dict[str, dict[int, float]] = field(default_factory=dict)  # field -> value -> p over valid values
    release_values: list[int] | None = None  # compat released: [ML, SC, ET, ST] as parsed (values: clamped)


@dataclass
class PrefilledTurn:
    """A turn's prompt after its one prefill: the predicted shot and what the state decoding continues from."""

    sequence: SequenceLayout
    shot_embeds: torch.Tensor  # (N, shot_dim) float32, on the model's device
    last_hidden: torch.Tensor  # (hidden,) final hidden state at the first field's open tag
    cache: Any  # the prompt's KV cache


@torch.no_grad()
def prefill_turn(model, history: list[HistoryTurn], instruction: str, kv_cache: str | None = None) -> PrefilledTurn:
    """Step 1 of :func:`predict_turn` (model in eval mode): prefill the prompt once, read the shot at the slots.
    ``kv_cache``: ``static`` (:mod:`animegamer.models.mllm_static`) or ``dynamic``; None: the model's own
    (``mllm.kv_cache``)."""
    layout = model.layout
    turns = [TurnSpec(h.instruction, h.values) for h in history]
    turns.append(TurnSpec(instruction, None, is_current=True))
    seq = layout.build_sequence(turns)
    slots = seq.slot_positions[-1]  # consecutive positions: a slice, not an index tensor copied from the host
    previous = history[-1].shot_embeds if history else None  # read only by a shot_residual "previous" model
    if (kv_cache or model.kv_cache) == "static":
        hidden, cache = prefill_static(model, seq.input_ids, seq.slot_positions[:-1], [h.shot_embeds for h in history])
        shot_embeds = model.predict_shots(hidden[slots[0] : slots[0] + len(slots)], previous)  # (N, shot_dim)
        return PrefilledTurn(seq, shot_embeds, hidden[-1], cache)
    device = model.device
    input_ids = torch.tensor([seq.input_ids], device=device)  # (1, T)
    if history:
        positions = torch.tensor(seq.slot_positions[:-1], device=device)  # (M, N)
        shots = torch.stack([h.shot_embeds.to(device) for h in history])  # (M, N, D)
        embeds = model.embed(input_ids, positions, shots)
    else:
        embeds = model.embed(input_ids)
    from transformers import DynamicCache  # heavy: imported where a model runs, as everywhere in the package

    # A plain cache, not the sliding-window one transformers picks for Mistral: that one copies a host scalar to the
    # GPU in every layer as it first stores keys, and each copy makes the host wait for the GPU mid-prefill. The
    # window is still applied by the attention mask (from the config); the cache only stops cropping its keys.
    hidden, cache = model.transformer(embeds, use_cache=True, past_key_values=DynamicCache())  # (1, T, hidden)
    shot_embeds = model.predict_shots(hidden[0, slots[0] : slots[0] + len(slots)], previous)  # (N, shot_dim)
    return PrefilledTurn(seq, shot_embeds, hidden[0, -1], cache)


@torch.no_grad()
def decode_states(model, prefilled: PrefilledTurn) -> tuple[dict[str, int], dict[str, dict[int, float]]]:
    """Step 2 of :func:`predict_turn`: each field's value (argmax over its value tokens only), fed back through
    the cache with the next tags. Returns (field -> chosen token id, field -> value -> probability); the cache
    grows by 3 tokens per field but the last. The choices stay on the model's device until the last field is
    decoded (one transfer to the host per turn, not one per field), so a GPU never waits for the host between
    fields. A static prefill's fixed cache is decoded by :func:`animegamer.models.mllm_static.state_steps`."""
    if is_fixed(prefilled.cache):
        picked, p_all = to_host(*decode_static(model, prefilled.last_hidden, prefilled.cache))
        return host_choices(model, [int(i) for i in picked.tolist()], p_all.tolist())
    device = model.device
    cache, last = prefilled.cache, prefilled.last_hidden  # last: the open tag of the first field
    choices, dists = [], []
    for i, name in enumerate(STATE_FIELDS):
        logits = model.value_logits(last, name)  # (num_values,)
        choices.append(logits.argmax())  # () on the device
        dists.append(logits.softmax(-1))
        if i + 1 == len(STATE_FIELDS):
            break
        value_ids = model.device_table("values", name, device)  # (num_values,)
        tags = model.device_table("step", name, device)  # (2,): close tag, next open tag
        # value, close tag, next open tag (1, 3); index_select keeps the choice on the device (t[0-d tensor] syncs)
        step = torch.cat([value_ids.index_select(0, choices[-1].view(1)), tags])[None]
        hidden, cache = model.transformer(model.embed(step), past_key_values=cache, use_cache=True)
        last = hidden[0, -1]
    picked = torch.stack(choices).tolist()  # the one transfer to the host
    p_all = torch.cat(dists).float().cpu().tolist()
    return host_choices(model, picked, p_all)


def host_choices(model, picked: list[int], p_all: list[float]) -> tuple[dict[str, int], dict[str, dict[int, float]]]:
    """(field -> chosen token id, field -> value -> probability) from the choices (index among each field's
    values) and the probabilities of all values, concatenated in field order."""
    layout = model.layout
    chosen: dict[str, int] = {}
    probs: dict[str, dict[int, float]] = {}
    offset = 0
    for name, choice in zip(STATE_FIELDS, picked, strict=True):
        ids = layout.value_ids[name]
        chosen[name] = ids[choice]
        probs[name] = {layout.id_to_value[name][t]: p_all[offset + j] for j, t in enumerate(ids)}
        offset += len(ids)
    return chosen, probs


def slot_block_mask(length: int, slots: list[int], device) -> torch.Tensor:
    """(1, 1, T, T) boolean attention mask: causal, plus the square block of ``slots`` (the current turn's, in one
    run) fully visible to itself."""
    mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    mask[slots[0] : slots[-1] + 1, slots[0] : slots[-1] + 1] = True
    return mask[None, None]


@torch.no_grad()
def slot_block_pass(model, seq: SequenceLayout, history_shots: torch.Tensor | None) -> torch.Tensor:
    """Final hidden states (T, hidden) of a pass over ``seq`` under :func:`slot_block_mask`, history slots carrying
    ``history_shots`` (M, N, shot_dim) or plain token embeddings when None."""
    device = model.device
    input_ids = torch.tensor([seq.input_ids], device=device)  # (1, T)
    if history_shots is not None and len(history_shots):
        positions = torch.tensor(seq.slot_positions[:-1], device=device)  # (M, N)
        embeds = model.embed(input_ids, positions, history_shots.to(device))
    else:
        embeds = model.embed(input_ids)
    mask = slot_block_mask(len(seq), seq.slot_positions[-1], device)
    hidden, _ = model.transformer(embeds, attention_mask=mask)  # (1, T, hidden)
    return hidden[0]


@torch.no_grad()
def slot_block_shots(model, seq: SequenceLayout, history: list[HistoryTurn]) -> torch.Tensor:
    """The shot (N, shot_dim) of a ``slot_attention: bidirectional`` model: read at the current slots of
    :func:`slot_block_pass`.

    A second pass over the prompt, on purpose: the state tags come after the slot block, so their keys/values
    depend on the mask from the block on, and the states are decoded from the causal prefill's cache (what
    decoding them from this pass's cache would change: docs/released_weights.md, B2).
    """
    shots = torch.stack([h.shot_embeds for h in history]) if history else None  # (M, N, shot_dim)
    previous = history[-1].shot_embeds if history else None
    return model.predict_shots(slot_block_pass(model, seq, shots)[seq.slot_positions[-1]], previous)


@torch.no_grad()
def predict_turn(model, history: list[HistoryTurn], instruction: str) -> TurnPrediction:
    """Predict the next turn from ``history`` (used as given: window it first) and the instruction, with the
    model's KV cache (``mllm.kv_cache``: static, one transfer to the host per turn; or dynamic)."""
    was_training = model.training
    model.eval()
    try:
        prefilled = prefill_turn(model, history, instruction)
        shot_embeds = prefilled.shot_embeds
        if model.slot_attention == "bidirectional":
            shot_embeds = slot_block_shots(model, prefilled.sequence, history)
        if is_fixed(prefilled.cache):  # the shot, choices and probabilities come back together
            picked, p_all, shot_embeds = to_host(*decode_static(model, prefilled.last_hidden, prefilled.cache),
                                                 shot_embeds)
            chosen, probs = host_choices(model, [int(i) for i in picked.tolist()], p_all.tolist())
        else:
            chosen, probs = decode_states(model, prefilled)
    finally:
        model.train(was_training)
    return TurnPrediction(
        shot_embeds=shot_embeds.float().cpu(),
        values=model.layout.decode_values(chosen),
        prompt_tokens=len(prefilled.sequence),
        value_probs=probs,
    )


# one turn of a model: (model, history as given, instruction) -> prediction
TurnFunction = Callable[[Any, list[HistoryTurn], str], TurnPrediction]
