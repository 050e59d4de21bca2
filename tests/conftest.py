"""Shared fixtures: tiny random models written in their real on-disk layouts, synthetic clips."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from animegamer import tiny
from animegamer.config import CLIPConfig, T5Config, load_config
from animegamer.data.video import write_mp4
from animegamer.game.build import build_session
from tests.helpers.clips import make_clip_frames
from tests.helpers.game import GAME, TINY, tiny_overrides
from tests.helpers.stage_runs import write_stage_a_data, write_stage_c_runs, write_stage_d_run

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(2)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_clip_config(tmp_path_factory) -> CLIPConfig:
    """A tiny open_clip ViT saved to disk; the CLIPConfig that loads it through the real loader."""
    out = tmp_path_factory.mktemp("tiny_clip")
    config_path, weights = tiny.build_tiny_clip(out)
    return CLIPConfig(arch=tiny.TINY_CLIP_ARCH, checkpoint=str(weights), model_config=str(config_path), image_size=32)


@pytest.fixture(scope="session")
def tiny_t5_config(tmp_path_factory) -> T5Config:
    """A tiny T5 encoder + sentencepiece tokenizer trained on the fly, in diffusers layout."""
    out = tmp_path_factory.mktemp("tiny_t5")
    tiny.build_tiny_t5(out)
    return T5Config(path=str(out), max_length=226)


@pytest.fixture(scope="session")
def tiny_cogvideox_dir(tiny_t5_config):
    """A whole tiny CogVideoX folder: transformer/, vae/, scheduler/ added beside the tiny T5 (64x96 clips)."""
    return tiny.build_tiny_cogvideox(tiny_t5_config.path)


@pytest.fixture(autouse=True)
def signal_handlers_as_they_were():
    """Every test starts with Python's own Ctrl-C handling and the worker's other signal handlers, and leaves them
    so: an in-process game or run that installs its own (SIGHUP/SIGTERM), or a library that left SIGINT ignored in
    this process, must not change what a later test's child processes inherit (a child of a process that ignores
    SIGINT ignores Ctrl-C too)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    numbers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGXFSZ)
    before = {number: signal.getsignal(number) for number in numbers}
    yield
    if main:
        for number, handler in before.items():
            if handler is not None and signal.getsignal(number) is not handler:
                signal.signal(number, handler)


@pytest.fixture
def one_thread():
    """Tiny models on shared, busy cores: one torch thread is often >10x faster than two fighting for them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory):
    """A tiny MistralForCausalLM + Llama-style BPE tokenizer trained on the fly, in HF layout."""
    return tiny.build_tiny_mistral(tmp_path_factory.mktemp("tiny_mistral"))


@pytest.fixture
def synthetic_clip(tmp_path):
    """A short mp4 written with the project's writer, and its frames."""
    frames = make_clip_frames()
    path = write_mp4(tmp_path / "clip.mp4", frames, fps=8)
    return path, frames


@pytest.fixture(scope="module")
def played(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path_factory):
    """A rendered two-turn game of the tiny models (a GameSession) and its save file, per test module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = load_config(TINY, tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path_factory.mktemp("play")))
    session = build_session(cfg)
    for text in GAME[:2]:
        session.play(text)
    save = session.save(tmp_path_factory.mktemp("save") / "game.save")
    yield session, save
    torch.set_num_threads(before)


# the stages' tiny inputs, built once per test module that asks (the stage tests and the engine tests)
@pytest.fixture(scope="module")
def stage_a_data(tmp_path_factory, tiny_clip_config, tiny_cogvideox_dir) -> dict:
    """Stage (a)'s tiny clips with their features precomputed: ``write_stage_a_data``."""
    return write_stage_a_data(tmp_path_factory.mktemp("stage_a_data"), tiny_clip_config, tiny_cogvideox_dir)


@pytest.fixture(scope="module")
def stage_c_runs(tmp_path_factory, tiny_cogvideox_dir, tiny_mistral_dir) -> dict:
    """Stage (c)'s tiny data and its stage (a), (b) checkpoints: ``write_stage_c_runs``."""
    return write_stage_c_runs(tmp_path_factory.mktemp("stage_c"), tiny_cogvideox_dir, tiny_mistral_dir)


@pytest.fixture(scope="module")
def stage_d_run(tmp_path_factory, tiny_cogvideox_dir) -> dict:
    """Stage (d)'s tiny conditions and its stage (c) checkpoint: ``write_stage_d_run``."""
    return write_stage_d_run(tmp_path_factory.mktemp("stage_d"), tiny_cogvideox_dir)
