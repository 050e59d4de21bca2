"""The MLLM side of a game: :class:`MLLMPredictor` (the :class:`animegamer.game.turn.StatePredictor` of a
model, its turn function :func:`animegamer.models.mllm_turn.predict_turn` or the release's own) and the instruction
check.

    predictor = MLLMPredictor(model, device="cuda", max_instruction_tokens=96)     # a StatePredictor
    prediction = predictor.predict_turn(history, "Character: Qiqi; Motion: gently lie down; Background: park.")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from animegamer.game.turn import on_device
from animegamer.models.mllm_turn import HistoryTurn, TurnFunction, TurnPrediction, predict_turn


class InstructionError(ValueError):
    """An instruction the MLLM cannot take: empty, too many tokens, or containing reserved layout tokens."""


def validate_instruction(text: str, tokenizer: Any, base_vocab: int, max_tokens: int, where: str = "") -> list[int]:
    """Token ids of an instruction, or :class:`InstructionError` naming ``where`` and the problem."""
    prefix = f"{where}: " if where else ""
    if text is None or not text.strip():
        raise InstructionError(f"{prefix}empty instruction")
    shown = repr(text[:60]) + ("..." if len(text) > 60 else "")
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    special = set(tokenizer.all_special_ids)  # </s> or <unk> typed into an instruction would end or confuse a turn
    reserved = [tokenizer.convert_ids_to_tokens(i) for i in ids if i >= base_vocab or i in special]
    if reserved:
        raise InstructionError(f"{prefix}instruction contains the reserved token(s) {reserved[:3]}: {shown}")
    if len(ids) > max_tokens:
        raise InstructionError(
            f"{prefix}instruction is {len(ids)} tokens, more than mllm.max_instruction_tokens={max_tokens}: {shown}"
        )
    return ids


class MLLMPredictor:
    """The core's :class:`animegamer.game.turn.StatePredictor`: the MLLM in eval mode, moved to ``device`` only
    while it predicts when ``offload``; ``predict`` is the turn function (:func:`predict_turn`; the release's own:
    animegamer.official.agent.predict_released)."""

    def __init__(self, model, device: str | None = None, offload: bool = False, max_instruction_tokens: int = 96,
                 *, predict: TurnFunction = predict_turn):
        self.model = model.eval()
        self.device = device if device is not None else str(model.device)
        self.offload, self.max_instruction_tokens, self.predict = offload, max_instruction_tokens, predict

    @property
    def shot_shape(self) -> tuple[int, int]:
        """(num_slots, shot_dim) of the shots this model predicts and reads back as history."""
        return self.model.num_slots, self.model.shot_dim

    def validate(self, instruction: str, where: str = "") -> None:
        """Token count and reserved tokens: :class:`InstructionError` (a ValueError)."""
        validate_instruction(instruction, self.model.tokenizer, self.model.base_vocab, self.max_instruction_tokens,
                             where)

    def predict_turn(self, history: Sequence[HistoryTurn], instruction: str) -> TurnPrediction:
        with on_device(self.model, self.device, self.offload):
            return self.predict(self.model, list(history), instruction)
