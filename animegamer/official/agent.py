"""One turn of converted official weights the release's way (``compat: released``), as a turn function of
:class:`animegamer.game.predictor.MLLMPredictor` (:func:`predict_released`), beside the core's ``fixed`` turn.

The release runs two passes per turn over ``<s> [history turns] <TURN> caption <img><frame> 226 frame tokens
</frame></img><ML>`` (../shared/official_ref/README.md lists its behaviours B1-B6)::

    shot pass   (its generate_bi)  history slots <- input_resampler(s_a); causal attention except the current turn's
                                   226 frame tokens, which see each other (B2); s_a = output_resampler(final hidden)
    state pass  (its generate)     greedy decoding of up to 200 tokens over the whole vocabulary, parsed from text

    behaviour                       released (this module)                     fixed (the core, mllm_runner)
    B1 s_a read at                  the last 226 positions (3 too late)        the 226 frame slots
    B3 state pass input             plain token embeddings (history s_a lost)  history slots carry input_resampler(s_a)
    B4 state decoding               logits processor (scores of 100 frame ids  constrained: each field's argmax over
                                    and </frame> set to 0.0), 200 free tokens  its value tokens, 4 fields
    B5 history state tokens         always <Strength_0>, </ST> twice           the turn's own values, one </ST>
    B6 parsing                      split on spaces, tokens 0/3/6/9, [10:-1];  none needed: values are token ids
                                    any failure -> [0, 0, 0, 0]
    B6 window                       the previous max_window - 1 turns          the previous history_turns turns
    B2 frame block                  bidirectional in the shot pass             the same (slot_attention: bidirectional)

The window (:func:`release_window`) is the runner's: ``history_turns = max_window - 1``.
The release's values can leave our ranges (a failed parse gives motion level 0): :class:`ReleaseTurn` keeps them
as parsed, and ``values`` holds them clamped into range for the game state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from animegamer.models.mllm_turn import HistoryTurn, TurnPrediction, slot_block_pass
from animegamer.states import VALUE_RANGES, StateValues
from animegamer.tokens import IGNORE_INDEX, STATE_FIELDS, SequenceLayout, TurnSpec

RELEASE_MAX_NEW_TOKENS = 200  # the release's generate(max_new_tokens=200)
RELEASE_VIDEO_GEN_TOKENS = 100  # AutoVideoTokenGenerationProcessor(num_vid_gen_tokens=100)
RELEASE_FORCE_MARGIN = 10.0  # the processor forces the next chain token with max + 10
PARSE_FAILED = [0, 0, 0, 0]


@dataclass
class ReleaseHistory:
    """An earlier turn as the release's shot pass sees it (its states never reach the prompt: B5)."""

    instruction: str
    shot_embeds: torch.Tensor  # (N, shot_dim)
    text_ids: list[int] | None = None  # the caption's ids when known (tests); else the layout encodes it


@dataclass(frozen=True)
class ReleaseWindow:
    """What the release's per-turn loop feeds turn ``index`` (0-based) with ``max_window`` W."""

    history: list[int]  # the earlier turns in the prompt, oldest first: the previous W - 1 (fewer at the start)
    slots: tuple[int, int]  # [start, end) of its s_a buffer passed in: the history, the current (zero) slot, and
    # before turn W the not-yet-played zero slots up to W (turn 0: the first slot alone)
    gen_turn_id: int  # min(index, W - 1): where the current turn sits in that window


def release_window(index: int, max_window: int) -> ReleaseWindow:
    """The window rule of the release's inference loop (B6) for turn ``index`` (0-based), any ``max_window`` >= 1.

    Only ``history`` reaches the numbers: the history slots take the window's entries in order, and the zero slots
    after them are read by nothing (the turn-0 window adds 0.0 times a resampled zero slot: a no-op)."""
    if max_window < 1 or index < 0:
        raise ValueError(f"max_window must be >= 1 and the turn index >= 0, got {max_window}, {index}")
    if index == 0:
        return ReleaseWindow([], (0, 1), 0)
    start = index - max_window + 1 if index >= max_window else 0
    history = [start + k for k in range(min(index, max_window - 1))]
    return ReleaseWindow(history, (start, start + max_window), min(index, max_window - 1))


def release_history_state_tokens(layout) -> list[int]:
    """A history turn's state tokens as the release's loop writes them (B5): every value is ``<Strength_0>`` (it
    formats them from the current turn's still-empty entry) and ``</ST>`` comes twice."""
    zero = layout.value_id(STATE_FIELDS[0], 0)  # <Strength_0>, though 0 is no motion level of ours
    out = []
    for name in STATE_FIELDS:
        out += [layout.open_ids[name], zero, layout.close_ids[name]]
    return [*out, layout.close_ids[STATE_FIELDS[-1]]]


def release_sequence(
    model,
    history: list[ReleaseHistory],
    instruction: str,
    text_ids: list[int] | None = None,
    values: list[StateValues] | None = None,
) -> SequenceLayout:
    """The release's prompt: history turns with its B5 state tokens, then the current turn up to its ``<ML>``.
    ``values`` (one per history turn) lays the history out the core's way instead, with those values."""
    layout = model.layout
    if values is not None:
        turns = [TurnSpec(h.instruction, values[i], text_ids=h.text_ids) for i, h in enumerate(history)]
        turns.append(TurnSpec(instruction, None, is_current=True, text_ids=text_ids))
        return layout.build_sequence(turns)
    ids: list[int] = [int(layout.tokenizer.bos_token_id)]
    slot_positions, spans = [], []
    turns = [(h.instruction, h.text_ids) for h in history] + [(instruction, text_ids)]
    for index, (text, known_ids) in enumerate(turns):
        start = len(ids)
        caption = known_ids if known_ids is not None else layout.encode_text(text)
        ids += [layout.turn_open_id, *caption, *layout.shot_open_ids]
        slot_positions.append(list(range(len(ids), len(ids) + layout.num_slots)))
        ids += [*layout.slot_ids, *layout.shot_close_ids]
        if index < len(history):
            ids += [*release_history_state_tokens(layout), layout.turn_close_id]
        else:
            ids.append(layout.open_ids[STATE_FIELDS[0]])
        spans.append((start, len(ids)))
    return SequenceLayout(
        input_ids=ids,
        slot_positions=slot_positions,
        value_positions=[{} for _ in turns],
        labels=[IGNORE_INDEX] * len(ids),
        current_turn=len(history),
        state_prompt_end=len(ids),
        turn_spans=spans,
    )


@torch.no_grad()
def shot_pass(model, seq: SequenceLayout, history_shots: torch.Tensor | None, last_positions: bool) -> dict:
    """The release's generate_bi: hidden states and s_a (N, shot_dim) of the slot-block pass; ``last_positions``
    reads them at the last N positions of the prompt (B1, released) instead of the current frame slots (fixed)."""
    hidden = slot_block_pass(model, seq, history_shots)  # (T, hidden)
    read = list(range(len(seq) - model.num_slots, len(seq))) if last_positions else seq.slot_positions[-1]
    slot_hidden = hidden[read]  # (N, hidden)
    return {"hidden": slot_hidden, "shot_embeds": model.predict_shots(slot_hidden)}


def release_process_scores(scores: torch.Tensor, last_token: int, chain: list[int]) -> torch.Tensor:
    """The release's logits processor, in place on ``scores`` (V,) (B4). ``chain`` = [<frame>, the first 100 frame
    tokens, </frame>]: after a chain token its successor is forced (max + 10); otherwise the scores of the chain's
    frame tokens and </frame> are set to 0.0 (not -inf)."""
    if last_token in chain[:-1]:
        scores[chain[chain.index(last_token) + 1]] = scores.max() + RELEASE_FORCE_MARGIN
    else:
        scores[chain[1:]] = 0.0
    return scores


def release_chain(model) -> list[int]:
    layout = model.layout
    return [layout.shot_open_ids[-1], *layout.slot_ids[:RELEASE_VIDEO_GEN_TOKENS], layout.shot_close_ids[0]]


@torch.no_grad()
def release_generate(model, seq: SequenceLayout, max_new_tokens: int = RELEASE_MAX_NEW_TOKENS) -> dict:
    """The release's generate: greedy decoding from the plain token embeddings of the prompt (B3), with the
    logits processor (B4), until EOS or ``max_new_tokens``. Returns the raw first-step logits and the ids."""
    device = model.device
    chain = release_chain(model)
    eos = getattr(model.tokenizer, "eos_token_id", None)
    ids = torch.tensor([seq.input_ids], device=device)
    hidden, cache = model.transformer(model.embed(ids), use_cache=True)
    logits = model.token_logits(hidden[0, -1])  # (V,) float32
    first = logits.clone()
    last, generated = seq.input_ids[-1], []
    for _ in range(max_new_tokens):
        token = int(release_process_scores(logits, last, chain).argmax())
        generated.append(token)
        if token == eos:
            break
        hidden, cache = model.transformer(
            model.embed(torch.tensor([[token]], device=device)), past_key_values=cache, use_cache=True
        )
        logits, last = model.token_logits(hidden[0, -1]), token
    return {"first_step_logits": first, "generated_ids": generated}


def release_text(tokenizer, ids: list[int]) -> str:
    """Generated ids as the release's slow Llama tokenizer decodes them: added tokens spelled out and set apart by
    single spaces from their neighbours, the text between them decoded as usual."""
    added = set(tokenizer.get_added_vocab().values())
    parts: list[str] = []
    run: list[int] = []
    for token in ids:
        if token in added:
            if run:
                parts.append(tokenizer.decode(run))
                run = []
            parts.append(tokenizer.convert_ids_to_tokens(token))
        else:
            run.append(token)
    if run:
        parts.append(tokenizer.decode(run))
    return " ".join(parts)


def release_parse(text: str) -> list[int]:
    """[ML, SC, ET, ST] the release's way (B6): words 0/3/6/9 of ``text.split(' ')``, each ``<Strength_k>`` sliced
    ``[10:-1]``; any failure gives [0, 0, 0, 0]."""
    words = text.split(" ")
    try:
        return [int(words[i][10:-1]) for i in (0, 3, 6, 9)]
    except (IndexError, ValueError):
        return list(PARSE_FAILED)


def clamp_values(raw: list[int]) -> StateValues:
    """Released values brought into our ranges (a failed parse's motion level 0 becomes 1)."""
    out = {}
    for name, value in zip(STATE_FIELDS, raw, strict=True):
        allowed = VALUE_RANGES[name]
        out[name] = min(max(value, min(allowed)), max(allowed))
    return StateValues(**out)


def release_render_level(release_values: object, num_levels: int) -> int:
    """The level a released turn renders at: the release's ``inference_Decoder.py`` keeps a parsed motion level
    of 1..num_levels-1 and sends anything else (5, a failed parse's 0, any other int) to its table's last row."""
    if not isinstance(release_values, list) or len(release_values) != 4 or any(
        type(v) is not int for v in release_values
    ):
        raise ValueError(f"release_values must be 4 integers [ML, SC, ET, ST], got {release_values!r}")
    level = release_values[0]
    return level if 1 <= level < num_levels else num_levels


@dataclass
class ReleaseTurn:
    shot_embeds: torch.Tensor  # (N, shot_dim) float32, on the model's device
    release_values: list[int]  # [ML, SC, ET, ST] as parsed (released) or chosen (fixed)
    values: StateValues
    prompt_tokens: int
    generated_ids: list[int]
    value_probs: dict[str, dict[int, float]]


@torch.no_grad()
def released_turn(
    model,
    history: list[ReleaseHistory],
    instruction: str,
    text_ids: list[int] | None = None,
    max_new_tokens: int = RELEASE_MAX_NEW_TOKENS,
) -> ReleaseTurn:
    """One turn with the release's numerics (``compat: released``)."""
    seq = release_sequence(model, history, instruction, text_ids)
    shots = torch.stack([h.shot_embeds for h in history]) if history else None  # (M, N, shot_dim)
    shot = shot_pass(model, seq, shots, last_positions=True)
    generated = release_generate(model, seq, max_new_tokens)["generated_ids"]
    raw = release_parse(release_text(model.tokenizer, generated))
    return ReleaseTurn(shot["shot_embeds"], raw, clamp_values(raw), len(seq), generated, {})


@torch.no_grad()
def predict_released(model, history: list[HistoryTurn], instruction: str) -> TurnPrediction:
    """:func:`released_turn` as a predictor's turn function: ``MLLMPredictor(model, predict=...)`` in a game of
    ``history_turns = max_window - 1``."""
    was_training = model.training
    model.eval()
    try:
        turn = released_turn(model, [ReleaseHistory(h.instruction, h.shot_embeds) for h in history], instruction)
    finally:
        model.train(was_training)
    return TurnPrediction(
        turn.shot_embeds.float().cpu(), turn.values, turn.prompt_tokens, release_values=turn.release_values
    )
