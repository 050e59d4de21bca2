"""Helpers of the measurement programs under ``research/``: their JSON reports and the flags that pick a
manifest's clips."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from animegamer.cli import fail
from animegamer.data.manifest import read_manifest
from animegamer.io import atomic_write_json


def write_report(path: str | Path, report: dict, hide: tuple[str, ...] = ()) -> dict:
    """A research tool's JSON report: written atomically to ``path``, printed without the ``hide`` keys (the long
    per-row parts), its path on stderr. Returns ``report``."""
    atomic_write_json(path, report)
    print(json.dumps({k: v for k, v in report.items() if k not in hide}, indent=2))
    print(f"report {path}", file=sys.stderr)
    return report


def add_split_flags(parser: argparse.ArgumentParser, count: int, what: str, count_flag: str = "--clips") -> None:
    """``--manifest``, ``--split`` and a clip count: the flags of scripts that sample a manifest's train/test films."""
    parser.add_argument("--manifest", required=True, help="clips.jsonl with train/test films in its meta splits")
    parser.add_argument("--split", default="test", choices=("test", "train"), help="films to take the clips from")
    parser.add_argument(count_flag, type=int, default=count, help=f"{what} (evenly spread over the split)")


def split_clips(manifest_path: str, split: str, count: int) -> tuple[Any, list]:
    """The manifest and up to ``count`` evenly spread tagged clips of its ``split`` films
    (:meth:`Manifest.sample_split`); an unreadable manifest or an empty split exits with one readable line (code 2)."""

    try:
        manifest = read_manifest(manifest_path)
        return manifest, manifest.sample_split(split, count)
    except (ValueError, FileNotFoundError) as exc:  # ManifestError is a ValueError
        fail(str(exc))


def games_with_clips(benchmark: str, max_games: int, need: str) -> list:
    """The first ``max_games`` games of ``benchmark`` (0: all) when every one has its real clips; otherwise one
    line, ``error: <benchmark>: <need>`` (or the loader's own), and exit 2."""
    from animegamer.eval.games import GroundTruthGame, load_games

    try:
        games = load_games(benchmark, max_games)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if not all(isinstance(g, GroundTruthGame) and g.has_clips() for g in games):
        fail(f"{benchmark}: {need}")
    return games
