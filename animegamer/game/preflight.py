"""Checks an inference entry point runs before any model loads, each raising ValueError with one line.

    device = check_device(cfg.device)          # "auto" -> "cuda" or "cpu"; "cuda" without a GPU is refused
    check_output_dir(cfg.output_dir)           # exists or can be made, and a file can be written in it

Loading a 7B MLLM takes minutes; a run that would only fail afterwards (no GPU, an output folder it cannot write)
fails here instead.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


def check_device(name: str) -> str:
    """The device ``name`` means here (``auto``: ``cuda`` when a GPU is visible, else ``cpu``).

    ValueError for a name torch does not know, ``cuda``/``cuda:N`` without that GPU, ``mps`` without Metal.
    """
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"device={name!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name}: no CUDA GPU is visible here; use device=cpu (or device=auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device={name}: only {torch.cuda.device_count()} CUDA GPU(s) are visible")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device={name}: Metal (mps) is not available here; use device=cpu (or device=auto)")
    elif device.type != "cpu":
        raise ValueError(f"device={name}: unsupported here; use auto, cpu, cuda or cuda:N")
    return name


def check_output_dir(path: str | Path) -> Path:
    """``path`` as a folder that exists (made, with its parents, if missing) and takes a new file.

    Writing a probe file is the only test that also holds for root and read-only file systems (``os.access``
    says yes to root on a read-only mount). ValueError naming the folder and the reason otherwise.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"output_dir={path} is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"output_dir={path} cannot be written ({reason})") from None
    if not os.access(folder, os.R_OK | os.X_OK):
        raise ValueError(f"output_dir={path} cannot be read")
    return folder
