"""One turn of converted official weights, the release's way (``compat: released``) or with its bugs fixed (``fixed``).

The release runs two passes per turn over ``<s> [history turns] <TURN> caption <img><frame> 226 frame tokens
</frame></img><ML>`` (tests/data/official_ref/README.md lists its behaviours B1-B6)::

    shot pass   (its generate_bi)  history slots <- input_resampler(s_a); causal attention except the current turn's
                                   226 frame tokens, which see each other (B2); s_a = output_resampler(final hidden)
    state pass  (its generate)     greedy decoding of up to 200 tokens over the whole vocabulary, parsed from text

    behaviour                       released                                   fixed
    B1 s_a read at                  the last 226 positions (3 too late)        the 226 frame slots
    B3 state pass input             plain token embeddings (history s_a lost)  history slots carry input_resampler(s_a)
    B4 state decoding               logits processor (scores of 100 frame ids  constrained: each field's argmax over
                                    and </frame> set to 0.0), 200 free tokens  its value tokens, 4 fields
    B5 history state tokens         always <Strength_0>, </ST> twice           the turn's own values, one </ST>
    B6 parsing                      split on spaces, tokens 0/3/6/9, [10:-1];  none needed: values are token ids
                                    any failure -> [0, 0, 0, 0]
    B2 frame block                  bidirectional in the shot pass             the same (the weights were trained so)

The release's values can leave our ranges (a failed parse gives motion level 0): :class:`ReleaseTurn` keeps them
as parsed, and ``values`` holds them clamped into range for the game state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from animegamer.states import VALUE_RANGES, StateValues
from animegamer.tokens import STATE_FIELDS, SequenceLayout, TurnSpec

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


def release_sequence(
    model,
    history: list[ReleaseHistory],
    instruction: str,
    text_ids: list[int] | None = None,
    values: list[StateValues] | None = None,
) -> SequenceLayout:
    """The prompt: release-quirk history states (B5) when ``values`` is None, else the given values (fixed)."""
    turns = [
        TurnSpec(h.instruction, values[i] if values else None, text_ids=h.text_ids) for i, h in enumerate(history)
    ]
    turns.append(TurnSpec(instruction, None, is_current=True, text_ids=text_ids))
    return model.layout.build_sequence(turns, release_history_states=values is None)


def frame_block_mask(length: int, slots: list[int], device) -> torch.Tensor:
    """(1, 1, T, T) boolean mask: causal, plus the square block of the current frame tokens fully visible (B2)."""
    mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    mask[slots[0] : slots[-1] + 1, slots[0] : slots[-1] + 1] = True
    return mask[None, None]


@torch.no_grad()
def shot_pass(model, seq: SequenceLayout, history_shots: torch.Tensor | None, last_positions: bool) -> dict:
    """The release's generate_bi: hidden states and s_a (N, shot_dim); ``last_positions`` reads them at the last N
    positions of the prompt (B1, released) instead of the current frame slots (fixed)."""
    device = model.device
    input_ids = torch.tensor([seq.input_ids], device=device)  # (1, T)
    if history_shots is not None and len(history_shots):
        positions = torch.tensor(seq.slot_positions[:-1], device=device)  # (M, N)
        embeds = model.embed(input_ids, positions, history_shots.to(device))
    else:
        embeds = model.embed(input_ids)
    slots = seq.slot_positions[-1]
    hidden, _ = model.transformer(embeds, attention_mask=frame_block_mask(len(seq), slots, device))  # (1, T, hidden)
    read = list(range(len(seq) - model.num_slots, len(seq))) if last_positions else slots
    slot_hidden = hidden[0, read]  # (N, hidden)
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
