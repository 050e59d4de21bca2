"""Evaluation: metrics (``metrics``), the LLM-written benchmark games (``benchmark``) and the LLM judge (``judge``)."""
