"""Play AnimeGamer in the terminal: type an instruction, get the clip and the state bars.

    python -m animegamer.play --config configs/inference.yaml
    python -m animegamer.play --config configs/tiny/inference.yaml      # CPU, tiny models

Instructions are free text or ``Character: Qiqi; Motion: gently lie down; Background: night bedroom.``
Commands: ``:save [FILE]`` ``:load FILE`` ``:undo`` ``:state`` ``:help`` ``:quit``. A turn that fails, a save
that cannot be loaded and Ctrl-C during a turn each print one line and keep the game exactly as it was; Ctrl-C at
the prompt does not leave the game either (``:quit`` or end of input does).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from animegamer.cli import fail, parse_config
from animegamer.config import InferenceConfig
from animegamer.inference.contact_sheet import state_bar
from animegamer.inference.game import GameSession
from animegamer.inference.session import build_session

HELP = """commands:
  <instruction>      play a turn (free text or 'Character: …; Motion: …; Background: ….')
  :save [FILE]       save the game (default: <output_dir>/game.save)
  :load FILE         load a saved game and continue it
  :undo              take back the last turn
  :state             show the character's bars
  :help              this text
  :quit              leave"""


def show_state(session: GameSession, out: TextIO) -> None:
    state = session.state
    for name in ("stamina", "social", "entertainment"):
        print("  " + state_bar(name, getattr(state, name)), file=out)


def read_lines(lines: TextIO, out: TextIO) -> Iterator[str]:
    """The player's lines until end of input; Ctrl-C while waiting for one prints a hint instead of leaving
    (leaving would lose the unsaved turns)."""
    while True:
        try:
            raw = lines.readline()
        except KeyboardInterrupt:
            print("\ninterrupted: type :quit to leave (unsaved turns are lost), :save to keep them", file=out)
            continue
        if not raw:
            return
        yield raw


def run(session: GameSession, lines: TextIO, out: TextIO) -> GameSession:
    """The read-eval loop over ``lines`` (stdin or a script); returns the session as it ends."""
    print(f"AnimeGamer: {len(session.turns)} turns so far. Type :help for commands.", file=out)
    default_save = Path(session.output_dir) / "game.save"
    for raw in read_lines(lines, out):
        line = raw.strip()
        if not line:
            continue
        command, _, arg = line.partition(" ")
        before, turns_before = session, list(session.turns)  # what Ctrl-C during this command restores
        try:
            if command == ":quit":
                break
            elif command == ":help":
                print(HELP, file=out)
            elif command == ":state":
                show_state(session, out)
            elif command == ":undo":
                turn = session.undo()
                print(f"undid turn {turn.index}: {turn.instruction}", file=out)
                show_state(session, out)
            elif command == ":save":
                path = session.save(arg.strip() or default_save)
                print(f"saved {len(session.turns)} turns to {path}", file=out)
            elif command == ":load":
                if not arg.strip():
                    raise ValueError(":load needs a file")
                session = GameSession.load(arg.strip(), session.predictor, session.renderer, session.output_dir,
                                           history_turns=session.history_turns,
                                           max_instruction_chars=session.max_instruction_chars)
                print(f"loaded {len(session.turns)} turns from {arg.strip()}", file=out)
                show_state(session, out)
            elif command.startswith(":"):
                print(f"unknown command {command}; type :help", file=out)
            else:
                turn = session.play(line)
                v = turn.values
                print(f"turn {turn.index}: {turn.instruction}", file=out)
                print(f"  motion level {v.motion_level}  social {v.social}  entertainment {v.entertainment}  "
                      f"stamina {v.stamina:+d}", file=out)
                if turn.clip:
                    print(f"  clip: {turn.clip}", file=out)
                show_state(session, out)
        except KeyboardInterrupt:  # Ctrl-C mid-command: the command did not happen
            session = before
            session.turns[:] = turns_before
            print(f"\ninterrupted: {line[:60]!r} cancelled; the game is as it was ({len(session.turns)} turns)",
                  file=out)
        except (ValueError, IndexError, OSError) as exc:  # bad instruction or save file, full disk: game goes on
            print(f"error: {exc}", file=out)
        out.flush()
    return session


def main(argv: list[str] | None = None) -> None:
    cfg, _ = parse_config(InferenceConfig, __doc__, argv)
    try:
        session = build_session(cfg)
    except FileNotFoundError as exc:  # a checkpoint path, found before any model loads
        fail(str(exc))
    run(session, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
