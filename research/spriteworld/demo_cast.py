"""Who the rendered clips of a played SpriteWorld game draw, turn by turn: the protagonist, and the friend the turn
should show (named in the instruction, or only remembered: the friend met earlier, or the one following unsaid).

    make demo                                                   # writes outputs/demo/turn_XXX.mp4
    python research/spriteworld/demo_cast.py --game game_demo/spriteworld.txt --clips outputs/demo \\
        --out outputs/demo/cast.json

The game file's instructions are resolved as the world reads them (``memory.resolve_game``: ``still``, ``here``,
``back``, ``home``, ``friend``), the companion of each turn by the world's rule (``memory.follows``: after a social
turn the friend follows for two turns, not while sleeping), and each turn's clip is scored by the evaluation's
detector (``animegamer/spriteworld/identity.py``) against the turn's empty scenery. Indoors the game's home is
whatever the decoder drew, so the scenery is the home look (of the world's walls x floors x layouts) closest to the
clip's middle frame. A clip is right when the detector finds the protagonist and, on a friend turn, that friend.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np

from animegamer.cli import fail
from animegamer.data.video import read_video
from animegamer.eval.research import write_report
from animegamer.spriteworld.home import FLOORS, INDOORS, WALLS, HomeLook, home_background
from animegamer.spriteworld.identity import TurnCast, second_character
from animegamer.spriteworld.memory import follows, resolve_game
from animegamer.states import TagError, read_game_file


def closest_home(frames: np.ndarray, place: str, time: str) -> list | None:
    """Indoors, the home look (a ``[wall, floor, mirrored]`` list) whose empty scenery is nearest the clip's middle
    frame; None outdoors (the scenery does not depend on the home)."""
    if place not in INDOORS:
        return None
    height, width = frames.shape[1:3]
    middle = frames[len(frames) // 2].astype(np.float32)
    looks = [HomeLook(w, f, m) for w, f, m in itertools.product(range(len(WALLS)), range(len(FLOORS)), (False, True))]
    distances = [np.abs(home_background(place, time, height, width, look).astype(np.float32) - middle).mean()
                 for look in looks]
    return looks[int(np.argmin(distances))].to_list()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", required=True, help="the game file the clips were played from")
    parser.add_argument("--clips", required=True, help="the rendered game's folder (turn_000.mp4, turn_001.mp4, ...)")
    parser.add_argument("--out", required=True, help="the JSON report")
    args = parser.parse_args(argv)
    try:
        instructions = read_game_file(args.game)
        specs = resolve_game(instructions, source=args.game)
    except (FileNotFoundError, TagError) as exc:
        fail(f"{args.game}: {exc}")
    clips = [Path(args.clips) / f"turn_{t:03d}.mp4" for t in range(len(specs))]
    missing = [str(p) for p in clips if not p.is_file()]
    if missing:
        fail(f"{len(missing)} of {len(clips)} turns have no clip (first: {missing[0]}); render the game first")

    rows = []
    for t, (instruction, spec, companion, path) in enumerate(zip(instructions, specs, follows(specs), clips,
                                                                 strict=True)):
        frames, _ = read_video(str(path))  # (T, H, W, 3) uint8
        look = closest_home(frames, spec.place, spec.time)
        text = instruction.render()
        settings = {"home": look, "companion": companion, "height": frames.shape[1], "width": frames.shape[2]}
        cast = TurnCast.from_row(dataclasses.asdict(spec), settings, text)
        friend = cast.friend
        values = cast.score(frames)
        rows.append({"turn": t, "instruction": text, "hero": spec.character, "friend": friend,
                     "named": cast.named if friend else None, "home_look": look,
                     "drawn_second": second_character(frames, spec.character, cast.scenery), **values,
                     "right": all(v == 1.0 for v in values.values())})
    friend_rows = [r for r in rows if r["friend"]]
    report = {"command": " ".join(["python", "research/spriteworld/demo_cast.py", *(argv or sys.argv[1:])]),
              "turns": len(rows), "hero_on_screen": sum(r["hero_on_screen"] for r in rows),
              "friend_turns": len(friend_rows),
              "friend_right": sum(r.get("friend_named", r.get("friend_remembered", 0.0)) for r in friend_rows),
              "rows": rows}
    for r in rows:
        print(f"turn {r['turn']}: {r['instruction']}  -> friend {r['friend'] or '-'}"
              f"{' (named)' if r['named'] else ' (remembered)' if r['friend'] else ''}, drawn {r['drawn_second']},"
              f" hero {'on' if r['hero_on_screen'] else 'OFF'} screen", file=sys.stderr)
    return write_report(args.out, report, hide=("rows",))


if __name__ == "__main__":
    main()
