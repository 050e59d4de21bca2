"""Is the friend that was asked for on screen? Friend accuracy of an evaluation's SpriteWorld clips.

    python research/spriteworld/friends.py --eval-dir outputs/spriteworld/eval/main \\
        --games outputs/spriteworld/data/games

For every turn of the held-out games whose shot shows a second character (a social action, or in the memory world
the friend who follows), each system's rendered clip (``<eval-dir>/clips/<system>/<game>/turn_XXX.mp4``, as
scripts/evaluate.py writes them) and the real clip are read, and the second character is named by colour: of the
characters other than the protagonist, the one whose shirt colour covers the most pixels beyond what the shot's
empty scenery already has. Turns are split by whether the instruction named the friend or said "friend" (history).
Chance is 1/3 (three possible friends). Writes ``--out`` (JSON) and prints the accuracies, with the turns each
system was scored on: an evaluation writes the clips of its first ``clip_games`` games only (SpriteWorld's eval.yaml:
4), so evaluate with ``clip_games=-1`` for the whole report; a system with clips of fewer turns is warned about.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from animegamer.cli import command_name, write_report
from animegamer.io import iter_jsonl

TOLERANCE = 40.0  # RGB distance within which a pixel counts as a character's shirt colour


def colour_pixels(frames: np.ndarray, colour) -> float:
    """Pixels per frame within TOLERANCE of ``colour`` in (T, H, W, 3) uint8 ``frames``."""
    distance = np.linalg.norm(frames.astype(np.float32) - np.asarray(colour, np.float32), axis=-1)  # (T, H, W)
    return float((distance < TOLERANCE).sum() / len(frames))


def second_character(frames: np.ndarray, hero: str, scenery: np.ndarray) -> str:
    """The character other than ``hero`` whose shirt shows most in ``frames``, beyond the scenery's own pixels."""
    from animegamer.spriteworld import CHARACTERS

    if frames.shape[1:3] != scenery.shape[:2]:
        import cv2

        scenery = cv2.resize(scenery, (frames.shape[2], frames.shape[1]), interpolation=cv2.INTER_AREA)
    excess = {name: colour_pixels(frames, c.top) - colour_pixels(scenery[None], c.top)
              for name, c in CHARACTERS.items() if name != hero}
    return max(excess, key=excess.get)


def main(argv: list[str] | None = None) -> dict:
    from animegamer.data.video import read_video
    from animegamer.spriteworld.home import HomeLook, home_background

    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-dir", required=True, help="an evaluation's output_dir (with clips/<system>/...)")
    parser.add_argument("--games", required=True, help="the SpriteWorld games directory it played (<film>.jsonl)")
    parser.add_argument("--out", default="", help="JSON report (default: <eval-dir>/friends.json)")
    args = parser.parse_args(argv)
    eval_dir, games = Path(args.eval_dir), Path(args.games)
    clips_root = eval_dir / "clips"
    if not clips_root.is_dir() or not list(games.glob("*.jsonl")):
        print(f"error: need {clips_root} (an evaluation's clips) and {games}/*.jsonl (its games)", file=sys.stderr)
        raise SystemExit(2)
    systems = sorted(p.name for p in clips_root.iterdir() if p.is_dir())
    rows = []
    for game in sorted(games.glob("*.jsonl")):
        for _, turn in iter_jsonl(game, ValueError):
            spec = turn["spec"]
            friend = spec["friend"] or turn.get("companion", "")
            if not friend:
                continue
            look = HomeLook.from_value(turn.get("home"))
            scenery = home_background(spec["place"], spec["time"], turn.get("height", 64), turn.get("width", 96), look)
            named = friend in turn["instruction"]
            row = {"game": game.stem, "turn": turn["turn"], "friend": friend, "named": named,
                   "real": second_character(read_video(games.parent / turn["video"])[0], spec["character"], scenery)}
            for system in systems:
                clip = clips_root / system / game.stem / f"turn_{turn['turn']:03d}.mp4"
                if clip.is_file():
                    row[system] = second_character(read_video(clip)[0], spec["character"], scenery)
            rows.append(row)

    def accuracy(name: str, subset: list[dict]) -> float | None:
        scored = [r for r in subset if name in r]
        return float(np.mean([r[name] == r["friend"] for r in scored])) if scored else None

    report: dict = {"turns": len(rows), "chance": 1 / 3}
    for name in ("real", *systems):
        scored = sum(name in r for r in rows)
        report[name] = {"all": accuracy(name, rows), "named": accuracy(name, [r for r in rows if r["named"]]),
                        "not named": accuracy(name, [r for r in rows if not r["named"]]), "turns": scored}
        if scored < len(rows):
            print(f"warning: {name}: clips of {scored} of the {len(rows)} turns with a friend (evaluate with "
                  "clip_games=-1 to write every game's clips)", file=sys.stderr)
    report["rows"] = rows
    out = Path(args.out) if args.out else eval_dir / "friends.json"
    return write_report(out, report, hide=("rows",))


if __name__ == "__main__":
    main()
