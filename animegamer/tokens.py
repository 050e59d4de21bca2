"""Special tokens and the turn layout of the MLLM: the single place that knows them.

One turn of the game, as the MLLM sees it (paper vocabulary)::

    <TURN> instruction text <VS> <ANIME_0> … <ANIME_225> </VS>
           <MS> <level_3> </MS> <SC> <social_0> </SC> <ET> <ent_1> </ET> <ST> <stamina_-1> </ST> </TURN>

The released checkpoint spells the same layout ``<img><frame><frame_00000>…</frame></img>``, ``<ML>`` and
``<Strength_k>`` (one value spelling for every field: ``<SC><Strength_1></SC>``); both spellings are
:class:`TokenSpelling` instances of one layout. The ids of the released tokens come from the release's tokenizer
directory (``<frame_00000>`` = 32000 … ``</TURN>`` = 32283 there), never from the order of this list.

Earlier turns carry ``input_resampler(s_a)`` in their slots and their true state values; the current
turn carries learnable query embeddings in its slots and its state values are predicted, one token
per field, each constrained to that field's value tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from animegamer.states import VALUE_RANGES, StateValues

STATE_FIELDS = ("motion_level", "social", "entertainment", "stamina")
NUM_SLOTS = 226
IGNORE_INDEX = -100


@dataclass(frozen=True)
class TokenSpelling:
    """One spelling of the turn layout's special tokens."""

    name: str
    turn_open: str
    turn_close: str
    shot_open: tuple[str, ...]
    shot_close: tuple[str, ...]
    slot_format: str  # .format(i=slot index)
    field_tags: dict[str, str]  # state field -> tag name (without brackets)
    value_formats: dict[str, str]  # state field -> .format(v=value)
    # the instruction is tokenized together with the turn tag (``<TURN>`` + text in one string), so a sentencepiece
    # tokenizer starts it without a word-start piece (``Character``, not ``▁Character``): how the released
    # checkpoint was trained
    text_joins_turn_tag: bool = False

    def slot(self, i: int) -> str:
        return self.slot_format.format(i=i)

    def open_tag(self, field_name: str) -> str:
        return f"<{self.field_tags[field_name]}>"

    def close_tag(self, field_name: str) -> str:
        return f"</{self.field_tags[field_name]}>"

    def value_token(self, field_name: str, value: int) -> str:
        return self.value_formats[field_name].format(v=value)

    def value_tokens(self, field_name: str) -> list[str]:
        return [self.value_token(field_name, v) for v in VALUE_RANGES[field_name]]

    def special_tokens(self, num_slots: int = NUM_SLOTS) -> list[str]:
        """Every token this vocabulary adds to the tokenizer, in a fixed order."""
        tokens = [self.turn_open, self.turn_close, *self.shot_open, *self.shot_close]
        tokens += [self.slot(i) for i in range(num_slots)]
        for name in STATE_FIELDS:
            tokens += [self.open_tag(name), self.close_tag(name), *self.value_tokens(name)]
        return list(dict.fromkeys(tokens))


_VALUE_FORMATS = {"social": "<social_{v}>", "entertainment": "<ent_{v}>", "stamina": "<stamina_{v:+d}>"}

PAPER = TokenSpelling(
    name="paper",
    turn_open="<TURN>",
    turn_close="</TURN>",
    shot_open=("<VS>",),
    shot_close=("</VS>",),
    slot_format="<ANIME_{i}>",
    field_tags={"motion_level": "MS", "social": "SC", "entertainment": "ET", "stamina": "ST"},
    value_formats={"motion_level": "<level_{v}>", **_VALUE_FORMATS},
)

RELEASED = TokenSpelling(
    name="released",
    turn_open="<TURN>",
    turn_close="</TURN>",
    shot_open=("<img>", "<frame>"),
    shot_close=("</frame>", "</img>"),
    slot_format="<frame_{i:05d}>",
    field_tags={"motion_level": "ML", "social": "SC", "entertainment": "ET", "stamina": "ST"},
    value_formats={name: "<Strength_{v}>" for name in STATE_FIELDS},
    text_joins_turn_tag=True,
)

VOCABULARIES = {v.name: v for v in (PAPER, RELEASED)}


def get_vocabulary(name: str) -> TokenSpelling:
    if name not in VOCABULARIES:
        raise ValueError(f"unknown vocabulary {name!r}; choose one of {sorted(VOCABULARIES)}")
    return VOCABULARIES[name]


def add_special_tokens(tokenizer, vocab: TokenSpelling, num_slots: int = NUM_SLOTS) -> int:
    """Add the vocabulary's tokens to a Hugging Face tokenizer; returns how many were new."""
    return tokenizer.add_special_tokens(
        {"additional_special_tokens": vocab.special_tokens(num_slots)}, replace_extra_special_tokens=False
    )


@dataclass
class TurnSpec:
    """One turn of a sequence: its instruction and, for history turns (or training), its values."""

    instruction: str
    values: StateValues | None = None  # None: the values are to be predicted (current turn, inference)
    is_current: bool = False  # current turn: query slots, its values are the targets
    text_ids: list[int] | None = None  # the instruction's token ids when already known (else encode_text)


@dataclass
class SequenceLayout:
    """Token ids of a multi-turn sequence and where everything sits in it."""

    input_ids: list[int]
    slot_positions: list[list[int]]  # per turn, the num_slots positions of its slots
    value_positions: list[dict[str, int]]  # per turn, field -> position of its value token (if present)
    labels: list[int]  # IGNORE_INDEX except at the current turn's value tokens (next-token aligned)
    current_turn: int  # index of the current turn, -1 if none
    state_prompt_end: int = -1  # for a current turn without values: length of the prompt up to its first open tag
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each turn

    def __len__(self) -> int:
        return len(self.input_ids)


class TurnLayout:
    """Builds token ids for turns and sequences with one tokenizer and one vocabulary."""

    def __init__(self, tokenizer, vocab: TokenSpelling, num_slots: int = NUM_SLOTS):
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.num_slots = num_slots
        missing = [t for t in vocab.special_tokens(num_slots) if tokenizer.convert_tokens_to_ids(t) in (None,)]
        unk = getattr(tokenizer, "unk_token_id", None)
        missing += [
            t for t in vocab.special_tokens(num_slots) if unk is not None and tokenizer.convert_tokens_to_ids(t) == unk
        ]
        if missing:
            raise ValueError(
                f"tokenizer lacks {len(missing)} special tokens (e.g. {missing[0]}); call add_special_tokens"
            )
        ids = self._ids
        self.turn_open_id, self.turn_close_id = ids(vocab.turn_open), ids(vocab.turn_close)
        self.shot_open_ids = [ids(t) for t in vocab.shot_open]
        self.shot_close_ids = [ids(t) for t in vocab.shot_close]
        self.slot_ids = [ids(vocab.slot(i)) for i in range(num_slots)]
        self.open_ids = {f: ids(vocab.open_tag(f)) for f in STATE_FIELDS}
        self.close_ids = {f: ids(vocab.close_tag(f)) for f in STATE_FIELDS}
        # field -> (allowed token ids, the value each id stands for)
        self.value_ids = {f: [ids(t) for t in vocab.value_tokens(f)] for f in STATE_FIELDS}
        self.id_to_value = {f: dict(zip(self.value_ids[f], VALUE_RANGES[f], strict=True)) for f in STATE_FIELDS}

    def _ids(self, token: str) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(token))

    def encode_text(self, text: str) -> list[int]:
        """The instruction's ids as they follow ``<TURN>`` (see :attr:`TokenSpelling.text_joins_turn_tag`)."""
        if self.vocab.text_joins_turn_tag:
            ids = list(self.tokenizer.encode(self.vocab.turn_open + text, add_special_tokens=False))
            if ids and ids[0] == self.turn_open_id:
                return ids[1:]
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def value_id(self, field_name: str, value: int) -> int:
        return self._ids(self.vocab.value_token(field_name, value))

    def state_tokens(self, values: StateValues) -> list[int]:
        out = []
        for f in STATE_FIELDS:
            out += [self.open_ids[f], self.value_id(f, getattr(values, f)), self.close_ids[f]]
        return out

    def build_sequence(self, turns: list[TurnSpec], add_bos: bool = True) -> SequenceLayout:
        """Lay out turns one after another. At most one turn is current and it must be the last.

        A current turn with values (training) ends with its state tokens and ``</TURN>``; without values
        (inference) the sequence stops after its first open tag (``<MS>``), ready for constrained decoding.
        """
        if not turns:
            raise ValueError("a sequence needs at least one turn")
        current = [i for i, t in enumerate(turns) if t.is_current]
        if len(current) > 1 or (current and current[0] != len(turns) - 1):
            raise ValueError("only the last turn may be the current turn")
        ids: list[int] = []
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if add_bos and bos is not None:
            ids.append(int(bos))
        slot_positions, value_positions, spans = [], [], []
        labels_at: list[int] = []
        state_prompt_end = -1
        for index, turn in enumerate(turns):
            start = len(ids)
            text_ids = turn.text_ids if turn.text_ids is not None else self.encode_text(turn.instruction)
            ids += [self.turn_open_id, *text_ids, *self.shot_open_ids]
            slot_positions.append(list(range(len(ids), len(ids) + self.num_slots)))
            ids += self.slot_ids
            ids += self.shot_close_ids
            positions: dict[str, int] = {}
            if turn.values is None:
                if not turn.is_current:
                    raise ValueError(f"history turn {index} needs its state values")
                ids.append(self.open_ids[STATE_FIELDS[0]])
                state_prompt_end = len(ids)
            else:
                for f in STATE_FIELDS:
                    ids.append(self.open_ids[f])
                    positions[f] = len(ids)
                    ids.append(self.value_id(f, getattr(turn.values, f)))
                    ids.append(self.close_ids[f])
                ids.append(self.turn_close_id)
                if turn.is_current:
                    labels_at = list(positions.values())
            value_positions.append(positions)
            spans.append((start, len(ids)))
        labels = [IGNORE_INDEX] * len(ids)
        for pos in labels_at:
            labels[pos] = ids[pos]
        return SequenceLayout(
            input_ids=ids,
            slot_positions=slot_positions,
            value_positions=value_positions,
            labels=labels,
            current_turn=current[0] if current else -1,
            state_prompt_end=state_prompt_end,
            turn_spans=spans,
        )

    def decode_values(self, tokens: dict[str, int]) -> StateValues:
        """Map predicted value token ids (field -> id) back to :class:`StateValues`; invalid ids raise."""
        out = {}
        for f in STATE_FIELDS:
            token = tokens[f]
            if token not in self.id_to_value[f]:
                raise ValueError(f"token id {token} is not a value token of {f}")
            out[f] = self.id_to_value[f][token]
        return StateValues(**out)
