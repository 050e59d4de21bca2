"""The static-cache MLLM turn (animegamer.models.mllm_static) against today's dynamic one, and the host-sync counter
that measures both without a GPU."""

import pytest
import torch

from animegamer.bench.syncs import HostSyncCounter
from animegamer.models.mllm_static import (
    buffer_length,
    compile_static_turn,
    fixed_cache,
    release_fixed_cache,
    uncompile_static_turn,
)
from animegamer.models.mllm_turn import decode_states, predict_turn, prefill_turn
from tests.helpers.tiny_mllm import INSTRUCTIONS, history_turns, tiny_mllm

pytestmark = pytest.mark.usefixtures("one_thread")


def both(model, history, instruction):
    model.kv_cache = "dynamic"
    dynamic = predict_turn(model, history, instruction)
    model.kv_cache = "static"
    return dynamic, predict_turn(model, history, instruction)


def max_prob_difference(a, b) -> float:
    assert a.value_probs.keys() == b.value_probs.keys()
    return max(abs(a.value_probs[f][v] - b.value_probs[f][v]) for f in a.value_probs for v in a.value_probs[f])


# window 16: Mistral's sliding window shorter than every prompt (the longest is over 6 windows)
@pytest.mark.parametrize("window", [None, 16])
def test_static_turn_equals_dynamic_turn_fp32(tiny_mistral_dir, window):
    model = tiny_mllm(tiny_mistral_dir)
    model.llm.config.sliding_window = window
    prompts, values = set(), set()
    for count in range(4):
        history = history_turns(count)
        for instruction in INSTRUCTIONS:
            dynamic, static = both(model, history, instruction)
            assert static.values == dynamic.values
            assert static.prompt_tokens == dynamic.prompt_tokens
            assert torch.equal(static.shot_embeds, dynamic.shot_embeds)  # the prefill is the same arithmetic
            # the state steps attend over the whole fixed buffer (masked), which reorders float sums a little
            assert max_prob_difference(static, dynamic) < 2e-6
            prompts.add(static.prompt_tokens)
            values.add(static.values)
    assert len(prompts) == 8 and len(values) > 1  # every prompt length differs; not one constant answer
    if window is not None:  # the window shapes the outputs: without it they differ
        assert min(prompts) > window and max(prompts) > 6 * window
        model.llm.config.sliding_window = None
        assert not torch.allclose(predict_turn(model, history, instruction).shot_embeds, static.shot_embeds)


def test_static_turn_equals_dynamic_turn_bf16(tiny_mistral_dir):
    model = tiny_mllm(tiny_mistral_dir, dtype="bf16")
    for count in (0, 3):
        dynamic, static = both(model, history_turns(count), INSTRUCTIONS[0])
        assert static.values == dynamic.values
        torch.testing.assert_close(static.shot_embeds, dynamic.shot_embeds, rtol=1.6e-2, atol=1e-2)
        assert max_prob_difference(static, dynamic) < 2e-2


def test_prefill_and_decode_apart_give_the_same_turn(tiny_mistral_dir):
    model = tiny_mllm(tiny_mistral_dir)
    history = history_turns(2)
    for kind in ("dynamic", "static"):
        prefilled = prefill_turn(model, history, INSTRUCTIONS[1], kv_cache=kind)
        chosen, probs = decode_states(model, prefilled)
        model.kv_cache = kind
        whole = predict_turn(model, history, INSTRUCTIONS[1])
        assert model.layout.decode_values(chosen) == whole.values
        assert probs.keys() == whole.value_probs.keys()


def test_host_syncs_per_turn(tiny_mistral_dir):
    """Today's dynamic turn waits for the device 8 times (prompt, slot positions, 3 history shots copied from
    pageable memory; choices, probabilities and shot copied back apart); the static turn once."""
    model = tiny_mllm(tiny_mistral_dir)
    history = history_turns(3)
    counts = {}
    for kind in ("dynamic", "static"):
        model.kv_cache = kind
        predict_turn(model, history, INSTRUCTIONS[0])  # buffers allocated, tables copied: once per model
        with HostSyncCounter(host=[h.shot_embeds for h in history], device=model.device) as syncs:
            predict_turn(model, history, INSTRUCTIONS[0])
        counts[kind] = syncs.by_kind()
        assert all(where.startswith(("mllm_turn.py", "mllm_static.py")) for _, _, where in syncs.events)
    assert counts["dynamic"] == {"from host": 5, "to host": 3}
    assert counts["static"] == {"to host": 1}


def test_host_sync_counter_kinds():
    weights, host = torch.randn(3, 3), torch.randn(3)
    with HostSyncCounter(host=[host]) as syncs:
        ids = torch.tensor([1, 2])  # made on the host: not a sync
        on_device = host.to("cpu")  # a host tensor to the (CPU-standing) device: from host
        out = weights @ on_device
        out.argmax().item()  # scalar read
        bool(out.sum() > 0)  # scalar read
        (out > 0).nonzero()  # data shape
        out.tolist()  # to host
        (ids + 1).tolist()  # host work read on the host: not a sync
        torch.tensor([3.0], device="cpu")  # from host
        torch.tensor([], device="cpu")  # empty: no copy
        host.to("cpu", non_blocking=True)  # pinned where there is a GPU: queued, not waited for
        out.float().cpu()  # to host
    assert [kind for kind, _, _ in syncs.events] == [
        "from host", "scalar read", "scalar read", "data shape", "to host", "from host", "to host"]
    assert all(where.startswith("test_mllm_static.py:") for _, _, where in syncs.events)
    assert syncs.count == 7 and syncs.by_kind()["scalar read"] == 2


def test_fixed_buffers_are_reused_and_grown(tiny_mistral_dir):
    model = tiny_mllm(tiny_mistral_dir)
    assert buffer_length(1) == 64 and buffer_length(55) == 64 and buffer_length(56) == 128  # prompt + 9 state tokens
    model.kv_cache = "static"
    predict_turn(model, history_turns(1), INSTRUCTIONS[0])
    first = fixed_cache(model, 1)
    predict_turn(model, [], INSTRUCTIONS[0])  # a shorter prompt fits the same buffers
    assert fixed_cache(model, 1) is first
    predict_turn(model, history_turns(3), INSTRUCTIONS[1])  # 134 tokens: longer buffers
    grown = fixed_cache(model, 1)
    assert grown is not first and grown.length == buffer_length(134) == 192
    assert grown.layers[0].keys.shape[2] == 192
    release_fixed_cache(model)
    assert fixed_cache(model, 1) is not grown


@pytest.mark.slow
def test_compiled_static_turn_equals_eager(tiny_mistral_dir):
    model = tiny_mllm(tiny_mistral_dir)
    history = history_turns(2)
    model.kv_cache = "static"
    eager = [predict_turn(model, history, text) for text in INSTRUCTIONS]
    compile_static_turn(model, backend="aot_eager")
    try:
        compiled = [predict_turn(model, history, text) for text in INSTRUCTIONS]  # two prompt lengths, one graph
    finally:
        uncompile_static_turn(model)
    for a, b in zip(eager, compiled, strict=True):
        assert a.values == b.values
        torch.testing.assert_close(a.shot_embeds, b.shot_embeds, rtol=1e-6, atol=1e-6)
        assert max_prob_difference(a, b) < 1e-6
