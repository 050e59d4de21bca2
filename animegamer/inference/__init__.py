"""Inference: the MLLM turn runner, the game session, rendering of clips and contact sheets."""
