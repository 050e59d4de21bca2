"""scripts/benchmark.py on tiny models (CPU): every field of benchmark.json, the timing helpers, and the fast path
(batched CFG, merged LoRA, compiled blocks, cached state decoding) against the plain path at fp32 tolerance."""

import json
import math
import time
from dataclasses import replace
from importlib import import_module
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from animegamer.bench.models import FULL, TINY, build_decoder, build_mllm
from animegamer.bench.report import markdown, mfus_above_peak
from animegamer.bench.timing import PeakMemory, _rss_bytes, count_flops, measure, mllm_training_flops
from animegamer.bench.turn import STATE_TOKENS, make_history, plain_denoise, plain_generate
from animegamer.config import DecoderConfig, MLLMConfig, SamplingConfig
from animegamer.models.mllm_turn import decode_states, predict_turn, prefill_turn
from animegamer.sampling.denoise import sample as denoise

ROOT = Path(__file__).resolve().parents[1]
SAMPLING = SamplingConfig(steps=4, height=48, width=64, num_frames=9, guidance_scale=6.0)
INSTRUCTION = "Character: Qiqi; Motion: gently lie down; Background: night bedroom."
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def tiny_decoder():
    cfg = DecoderConfig(lora_rank=4, lora_alpha=4, motion_embed_dim=16, gradient_checkpointing=False, dtype="fp32")
    return build_decoder(TINY, cfg, "cpu", with_vae=True, seed=1).eval()


def tiny_mllm(tokenizer_dir):
    cfg = MLLMConfig(num_slots=8, lora_rank=4, lora_alpha=8, lora_dropout=0.0, gradient_checkpointing=False,
                     dtype="fp32")
    return build_mllm(TINY, cfg, "cpu", tokenizer_dir, seed=1).eval()


def sample(decoder, sampling=SAMPLING):
    shots = torch.randn(2, 226, 32, generator=torch.Generator().manual_seed(5))
    return denoise(decoder, shots, torch.tensor([2, 4]), sampling, generator=torch.Generator().manual_seed(3),
                   decode=False)


# ---------------------------------------------------------------------------------------------- the whole script

TURN_PATH_KEYS = {"path", "mllm_prefill_s", "mllm_states_s", "mllm_s", "denoise_s", "denoise_step_s", "denoise_mfu",
                  "vae_decode_s", "turn_s", "peak_memory_gb"}
EXPECTED = {
    "top": {"format", "date", "preset", "device", "settings", "conventions", "peak", "parameters", "training",
            "errors", "turn", "wall_s"},
    "device": {"type", "name", "torch", "diffusers", "transformers", "peft", "python", "threads"},
    "turn": {"settings", "plain", "ours", "speedup", "outputs", "flops", "fast", "sdpa_backends", "raw_s",
             "low_memory", "play_turn"},
    "turn.settings": {"height", "width", "num_frames", "latent_frames", "steps", "guided_steps", "guidance_scale",
                      "scheduler", "history_turns", "prompt_tokens", "state_tokens", "video_tokens",
                      "condition_tokens", "decoder_dtype"},
    "speedup": {"mllm_prefill", "mllm_states", "mllm", "denoise", "vae_decode", "turn"},
    "fast": {"steps", "guided_steps", "denoise_s", "turn_s", "speedup_vs_plain", "speedup_vs_ours", "peak_memory_gb"},
    "low_memory": {"offload", "vae_tiling", "compiled", "turn_s", "peak_memory_gb", "raw_s"},
    "play_turn": {"path", "turn_s", "peak_memory_gb", "raw_s"},
    "stage_a": {"settings", "flops_per_clip", "plain", "ours", "speedup"},
    "stage_a.path": {"step_s", "peak_memory_gb", "raw_s", "clips_per_s", "mfu"},
    "stage_b": {"settings", "flops_per_step", "tokenwise_params", "plain", "ours", "speedup"},
    "stage_b.path": {"step_s", "peak_memory_gb", "raw_s", "tokens_per_s", "mfu"},
}


def _timings(obj, key=""):
    """Every (key, value) under obj whose key (or a parent's, as raw_s) ends in _s; lists flattened."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _timings(v, key if key.endswith("_s") else k)
    elif isinstance(obj, list) and key.endswith("_s"):
        for v in obj:
            yield key, v
    elif key.endswith("_s") and not isinstance(obj, str):
        yield key, obj


def test_tiny_benchmark_writes_every_field(tmp_path, monkeypatch):
    script = import_module("scripts.benchmark")
    threads = torch.get_num_threads()
    try:
        script.main(["--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path}"])
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "benchmark.json").read_text())
    assert data["errors"] == {}
    assert set(data) == EXPECTED["top"]
    assert data["preset"] == "tiny" and data["format"] == "animegamer-benchmark-v1"
    assert set(data["device"]) >= EXPECTED["device"] and data["device"]["type"] == "cpu"
    turn = data["turn"]
    assert set(turn) == EXPECTED["turn"]
    assert set(turn["settings"]) == EXPECTED["turn.settings"]
    assert set(turn["plain"]) == set(turn["ours"]) == TURN_PATH_KEYS
    assert set(turn["speedup"]) == EXPECTED["speedup"]
    assert set(turn["fast"]) == EXPECTED["fast"] and set(turn["low_memory"]) == EXPECTED["low_memory"]
    assert set(turn["play_turn"]) == EXPECTED["play_turn"] and turn["play_turn"]["turn_s"] > 0
    assert set(data["training"]) == {"stage_a", "stage_b"}
    for stage in ("stage_a", "stage_b"):
        assert set(data["training"][stage]) == EXPECTED[stage]
        for path in ("plain", "ours"):
            assert set(data["training"][stage][path]) == EXPECTED[f"{stage}.path"]

    # the tiny config's settings reached the measurement
    s = turn["settings"]
    assert (s["height"], s["width"], s["num_frames"], s["latent_frames"], s["steps"]) == (48, 64, 9, 3, 6)
    assert s["history_turns"] == 3 and s["prompt_tokens"] > 4 * 226 and s["state_tokens"] == STATE_TOKENS == 10
    assert s["video_tokens"] == 3 * 3 * 4 and turn["fast"]["guided_steps"] == 3
    assert data["training"]["stage_a"]["settings"]["batch_size"] == 2  # configs/tiny/stage_a.yaml
    assert data["training"]["stage_b"]["settings"]["history_turns"] == 2  # configs/tiny/stage_b.yaml

    timings = list(_timings(data))
    assert len(timings) > 40
    for key, value in timings:
        # >= 0: the plain path's state decoding is a difference of two medians (clamped at 0), which a busy CPU can
        # make vanish; every other timing is a measured duration
        assert math.isfinite(value) and (value > 0 or key.endswith("mllm_states_s") and value == 0), (key, value)
    assert turn["ours"]["turn_s"] == pytest.approx(
        turn["ours"]["mllm_s"] + turn["ours"]["denoise_s"] + turn["ours"]["vae_decode_s"]
    )
    # MFU is positive; it is not bounded by 1 here, since the peak is timed on the same (possibly busy) CPU
    for value in [turn["plain"]["denoise_mfu"], turn["ours"]["denoise_mfu"]] + [
        data["training"][st][p]["mfu"] for st in ("stage_a", "stage_b") for p in ("plain", "ours")
    ]:
        assert math.isfinite(value) and value > 0
    for part in ("mllm", "denoise", "vae_decode"):
        assert turn["ours"]["peak_memory_gb"][part] > 0.1  # process RSS: torch + the models
    assert data["peak"]["tflops"] > 0 and data["parameters"]["decoder_transformer"]["total"] > 0
    # the fast path computes the same turn: fp32 tiny models, same seed
    assert turn["outputs"]["shot_embeds_rel_diff"] < 1e-4
    assert turn["outputs"]["latents_rel_diff"] < 1e-4
    # fp32 models: the float32 reference is the same computation, and the VAE decodes the same latents the same way
    assert turn["outputs"]["shot_embeds_rel_diff_plain_vs_fp32"] < 1e-6
    assert turn["outputs"]["frames_max_abs_diff"] <= 1.0
    assert turn["sdpa_backends"] == {}  # CUDA only

    table = (tmp_path / "benchmark.md").read_text()
    assert "| **turn** |" in table and "| (a) clips/s |" in table and "| (b) tokens/s |" in table
    # an MFU above 1 (a peak timed on a busy CPU) is flagged in the report, not printed as a measurement
    honest = json.loads(json.dumps(data))
    for path in ("plain", "ours"):
        honest["turn"][path]["denoise_mfu"] = 0.3
        for stage in ("stage_a", "stage_b"):
            honest["training"][stage][path]["mfu"] = 0.3
    assert mfus_above_peak(honest) == [] and "†" not in markdown(honest)
    honest["training"]["stage_a"]["ours"]["mfu"] = 1.5
    assert mfus_above_peak(honest) == ["training.stage_a.ours.mfu"]
    assert "150.0% †" in markdown(honest) and "not a measurement" in markdown(honest)
    assert data["date"][:10] in table and data["device"]["name"] in table

    # one part again, merged into the existing results (how a GPU session runs the parts as separate commands)
    try:
        script.main(["--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path}", "parts=[stage_a]",
                     "merge_existing=true", "train_repeats=1"])
    finally:
        torch.set_num_threads(threads)
    again = json.loads((tmp_path / "benchmark.json").read_text())
    assert again["turn"] == data["turn"] and again["training"]["stage_b"] == data["training"]["stage_b"]
    assert len(again["training"]["stage_a"]["ours"]["raw_s"]) == 1
    assert again["merged_from"] == {"turn": data["date"], "stage_b": data["date"]}
    assert "Parts kept from earlier runs" in (tmp_path / "benchmark.md").read_text()

    # a run stopped during its second part still leaves its first part, merged with the earlier ones, on disk
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # what a time limit does to a long GPU part

    monkeypatch.setattr(script, "bench_stage_a", stopped)
    with pytest.raises(KeyboardInterrupt):
        script.main(["--preset", "tiny", "--device", "cpu", f"output_dir={tmp_path}", "parts=[stage_b,stage_a]",
                     "merge_existing=true", "train_repeats=2"])
    torch.set_num_threads(threads)
    stopped_run = json.loads((tmp_path / "benchmark.json").read_text())
    assert len(stopped_run["training"]["stage_b"]["ours"]["raw_s"]) == 2  # measured by the stopped run
    assert stopped_run["training"]["stage_a"] == again["training"]["stage_a"] and stopped_run["turn"] == data["turn"]
    assert stopped_run["merged_from"] == {"turn": data["date"], "stage_a": again["date"]}


def test_cli_errors_exit_2(tmp_path):
    script = import_module("scripts.benchmark")
    with pytest.raises(SystemExit) as bad_part:
        script.main(["--preset", "tiny", "--device", "cpu", "parts=[turn,nope]", f"output_dir={tmp_path}"])
    assert bad_part.value.code == 2
    with pytest.raises(SystemExit) as bad_steps:
        script.main(["--preset", "tiny", "--device", "cpu", "student_steps=0", f"output_dir={tmp_path}"])
    assert bad_steps.value.code == 2
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as no_gpu:
            script.main(["--preset", "tiny", "--device", "cuda", f"output_dir={tmp_path}"])
        assert no_gpu.value.code == 2
    assert not (tmp_path / "benchmark.json").exists()


# ---------------------------------------------------------------------------------------------- the fast path


def test_batched_cfg_equals_the_plain_per_branch_loop():
    decoder = tiny_decoder()
    shots = torch.randn(2, 226, 32, generator=torch.Generator().manual_seed(5))
    levels = torch.tensor([2, 4])
    ours = sample(decoder)
    plain = plain_denoise(decoder, shots, levels, SAMPLING, torch.Generator().manual_seed(3))
    assert ours.shape == (2, 3, 4, 6, 8)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
    # guidance and the motion level both change the result, so the agreement above is not vacuous
    assert (sample(decoder, replace(SAMPLING, guidance_scale=1.0)) - ours).abs().max() > 1e-3
    other = denoise(decoder, shots, torch.tensor([5, 1]), SAMPLING, generator=torch.Generator().manual_seed(3),
                           decode=False)
    assert (other - ours).abs().max() > 1e-4
    # with motion guidance the unconditional branch gets the null level in both loops
    decoder.motion_guidance = True
    guided = sample(decoder)
    torch.testing.assert_close(
        guided, plain_denoise(decoder, shots, levels, SAMPLING, torch.Generator().manual_seed(3)), rtol=1e-5, atol=1e-5
    )
    assert (guided - ours).abs().max() > 1e-4


def test_merged_lora_and_compiled_blocks_give_the_same_clip():
    decoder = tiny_decoder()
    reference = sample(decoder)
    q_proj = decoder.transformer.transformer_blocks[0].attn1.to_q
    before = q_proj.base_layer.weight.detach().clone()
    decoder.merge_lora()
    assert (q_proj.base_layer.weight - before).abs().max() > 1e-4  # a real (random, non-zero) LoRA was folded in
    torch.testing.assert_close(sample(decoder), reference, rtol=1e-5, atol=1e-5)

    graphs = []

    def counting_backend(graph_module, example_inputs):  # dynamo captures the block; runs the captured graph as is
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    try:
        decoder.compile_blocks(backend=counting_backend)
        compiled = sample(decoder)
    finally:
        torch._dynamo.reset()
    assert graphs, "no transformer block went through torch.compile"
    torch.testing.assert_close(compiled, reference, rtol=1e-5, atol=1e-5)
    decoder.unmerge_lora()
    torch.testing.assert_close(q_proj.base_layer.weight, before, rtol=0, atol=1e-6)


def test_merged_mllm_predicts_the_same_turn(tiny_mistral_dir):
    model = tiny_mllm(tiny_mistral_dir)
    history = make_history(2, 8, 32, seed=0)
    reference = predict_turn(model, history, INSTRUCTION)
    model.merge_lora()
    merged = predict_turn(model, history, INSTRUCTION)
    assert merged.values == reference.values
    torch.testing.assert_close(merged.shot_embeds, reference.shot_embeds, rtol=1e-5, atol=1e-5)
    for field, probs in reference.value_probs.items():
        assert merged.value_probs[field] == pytest.approx(probs, abs=1e-5)
    model.unmerge_lora()
    torch.testing.assert_close(predict_turn(model, history, INSTRUCTION).shot_embeds, reference.shot_embeds)


def test_prefill_and_state_decoding_from_a_restored_cache(tiny_mistral_dir):
    model = tiny_mllm(tiny_mistral_dir)
    history = make_history(1, 8, 32, seed=2)
    full = predict_turn(model, history, INSTRUCTION)
    prefilled = prefill_turn(model, history, INSTRUCTION, kv_cache="dynamic")  # the static cache needs no crop
    length = prefilled.cache.get_seq_length()
    assert length == len(prefilled.sequence) == full.prompt_tokens
    first = decode_states(model, prefilled)
    assert prefilled.cache.get_seq_length() == length + STATE_TOKENS - 1  # all but the last value went in
    prefilled.cache.crop(length - prefilled.cache.get_seq_length())  # what the benchmark does between calls
    assert prefilled.cache.get_seq_length() == length
    second = decode_states(model, prefilled)
    assert first[0] == second[0] and model.layout.decode_values(first[0]) == full.values
    for field in first[1]:
        assert second[1][field] == pytest.approx(first[1][field], abs=1e-6)
    torch.testing.assert_close(prefilled.shot_embeds, full.shot_embeds)
    static = prefill_turn(model, history, INSTRUCTION, kv_cache="static")  # its steps rewrite the same positions
    assert decode_states(model, static)[0] == decode_states(model, static)[0] == first[0]
    # the plain path (transformers generate) reads the same slots from its own prefill
    torch.testing.assert_close(plain_generate(model, history, INSTRUCTION, 1), full.shot_embeds, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- timing helpers


def test_measure_counts_calls_and_peak_memory_sees_an_allocation():
    calls = []
    timing = measure(lambda: calls.append(time.sleep(0.001)), "cpu", warmup=2, repeats=3)
    assert len(calls) == 5 and len(timing.seconds) == 3
    assert all(s >= 0.001 for s in timing.seconds) and timing.best <= timing.median
    before = _rss_bytes()
    with PeakMemory("cpu") as mem:
        block = torch.ones(32 * 1024**2)  # 128 MiB, touched
        time.sleep(0.05)
        del block
    assert mem.peak_bytes - before > 100 * 1024**2


def test_flop_counts():
    x, layer = torch.randn(10, 32), torch.nn.Linear(32, 16)
    assert count_flops(lambda: layer(x)) == 2 * 10 * 32 * 16
    q = torch.randn(2, 4, 50, 8)  # (B, heads, S, head_dim): QK^T and PV, 2 FLOPs per multiply-add
    assert count_flops(lambda: F.scaled_dot_product_attention(q, q, q)) == 2 * 2 * (2 * 4 * 50 * 50 * 8)
    assert mllm_training_flops(100, 2, 8, [3, 5]) == 6 * 100 * 8 + 12 * 2 * 8 * (9 + 25)


def test_full_architecture_has_the_published_sizes():
    from diffusers import AutoencoderKLCogVideoX, CogVideoXTransformer3DModel
    from transformers import MistralConfig, MistralForCausalLM

    with torch.device("meta"):  # shapes only, no memory
        transformer = CogVideoXTransformer3DModel(**FULL.transformer)
        vae = AutoencoderKLCogVideoX(**FULL.vae)
        llm = MistralForCausalLM(MistralConfig(**FULL.mistral))

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert count(llm) == 7_241_732_096  # Mistral-7B-v0.1
    assert 1.68e9 < count(transformer) < 1.71e9  # CogVideoX-2B transformer
    assert 2.1e8 < count(vae) < 2.2e8
    assert FULL.hidden == 1920 and FULL.spatial_compression == 8


def test_float32_weights_restores_every_parameter_and_buffer_bit_for_bit():
    from animegamer.bench.turn import float32_weights

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(torch.bfloat16)
    module[1].running_mean.data = torch.randn(4)  # a float32 buffer beside bf16 ones
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with float32_weights(module):
        assert {v.dtype for k, v in module.state_dict().items() if "num_batches" not in k} == {torch.float32}
    after = module.state_dict()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
