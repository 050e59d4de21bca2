"""What the browser game's page shows, as pure functions of a game: the status line's text (every text from a player
or a file as text, no server path), the character's bars, the history rows, and the clip at display size.
:class:`animegamer.game.browser.WebGame` puts them together."""

from __future__ import annotations

import hashlib
import html
import re
import string
from pathlib import Path

import numpy as np

from animegamer.data.video import VideoReadError, probe_video, read_video, write_mp4
from animegamer.game.contact_sheet import readable_factor, upscale
from animegamer.game.session import GameSession, one_line
from animegamer.states import STATE_MAX, CharacterState

HISTORY_COLUMNS = ["turn", "instruction", "level", "social", "ent.", "stamina ±", "stamina · social · ent."]
HISTORY_WIDTHS = ["7%", "47%", "8%", "8%", "7%", "9%", "14%"]
BARS = (("stamina", "#2e9e5b"), ("social", "#2f7bd8"), ("entertainment", "#d8902f"))
CLIP_HEIGHT = 384  # pixels the clip is shown at; small clips are enlarged (nearest neighbour) to about this
# pixel-sharp enlargement in the browser too, and the clip as large as its box
APP_CSS = "#clip video { image-rendering: pixelated; width: 100%; height: 100%; object-fit: contain; }"


MARKDOWN_SPECIAL = frozenset(string.punctuation)  # CommonMark: any ASCII punctuation may be backslash-escaped


def as_text(text: object) -> str:
    """``text`` (from a player or a file: an instruction, an error quoting one, a file name) for the page's Markdown,
    shown as the same characters and nothing else: every ASCII punctuation character backslash-escaped, so no HTML
    tag, link, image, autolink, emphasis or entity can form, and line breaks as spaces (one line)."""
    return "".join("\\" + c if c in MARKDOWN_SPECIAL else c for c in " ".join(str(text).split()))


def tell(text: object, folders: tuple = ()) -> str:
    """An error for the page: one line of :func:`as_text` in which every path inside one of the server's
    ``folders`` (its output, upload and temp folders) is cut to its file's name: where the server keeps things is
    nobody's business in a browser."""
    text = one_line(text) if isinstance(text, BaseException) else str(text)
    for folder in sorted({str(f).rstrip("/") for f in folders if f}, key=len, reverse=True):
        text = re.sub(re.escape(folder) + r"/(?:[^\s/]+/)*", "", text)
    return as_text(text)


def compose_instruction(character: str, adverb: str, motion: str, background: str, free_text: str) -> str:
    """Free text wins; otherwise the structured form from the fields (the adverb goes before the motion)."""
    if free_text and free_text.strip():
        return free_text.strip()
    motion_text = " ".join(x.strip() for x in (adverb, motion) if x and x.strip())
    place = (background or "").strip()
    if not (character or "").strip() and not motion_text and not place:
        return ""
    return f"Character: {(character or '').strip()}; Motion: {motion_text}; Background: {place}."


def history_rows(session: GameSession | None) -> list[list]:
    if session is None:
        return []
    return [[t.index, t.instruction, t.values.motion_level, t.values.social, t.values.entertainment,
             f"{t.values.stamina:+d}", f"{t.state.stamina} · {t.state.social} · {t.state.entertainment}"]
            for t in session.turns]


def bars_html(session: GameSession | None) -> str:
    """The character's three bars as static HTML (a picture, nothing to drag)."""
    state = session.state if session is not None else CharacterState()
    rows = []
    for name, colour in BARS:
        value = getattr(state, name)
        percent = 100 * max(0, min(STATE_MAX, value)) / STATE_MAX
        rows.append(
            f'<div class="ag-bar" data-name="{name}" data-value="{value}" style="margin:6px 0">'
            f'<div style="display:flex;justify-content:space-between"><span>{html.escape(name)}</span>'
            f"<b>{value}</b></div>"
            f'<div style="background:#ddd;border-radius:4px;height:14px">'
            f'<div style="width:{percent:.0f}%;background:{colour};height:14px;border-radius:4px"></div></div></div>')
    return "".join(rows)


def large_clip(clip: Path) -> Path:
    """``clip`` enlarged by nearest neighbour to about :data:`CLIP_HEIGHT` rows, beside it
    (``<stem>_xN_<digest>.mp4``); the clip itself when it is large already, or when it cannot be read (the page then
    shows it small). The name carries a digest of the clip's bytes, so a clip written again under the same name
    (a turn undone and played again) gets a new enlarged copy, never the old one; older copies are removed."""
    try:
        factor = readable_factor(probe_video(clip).height, CLIP_HEIGHT)
        if factor == 1:
            return clip
        digest = hashlib.sha256(clip.read_bytes()).hexdigest()[:16]
        large = clip.with_name(f"{clip.stem}_x{factor}_{digest}.mp4")
        if not large.is_file():
            frames, fps = read_video(clip)  # (T, H, W, 3)
            write_mp4(large, upscale(frames, factor), fps=fps)
        for stale in clip.parent.glob(f"{glob_escape(clip.stem)}_x*_*.mp4"):
            if stale != large:
                stale.unlink(missing_ok=True)
    except (VideoReadError, OSError, ValueError):
        return clip
    return large


def display_clip(frames: np.ndarray, stem: Path, fps: float) -> Path:
    """(T, H, W, 3) uint8 frames as the page shows them, written once straight from memory: enlarged by nearest
    neighbour to about :data:`CLIP_HEIGHT` rows, ``<stem>_xN_<digest>.mp4`` (N = 1 for a clip large already). The
    name carries a digest of the frames, so a turn undone and played again gets a new file, never the old one;
    older copies beside it are removed."""
    factor = readable_factor(frames.shape[1], CLIP_HEIGHT)
    frames = np.ascontiguousarray(frames)
    digest = hashlib.sha256(repr(frames.shape).encode() + frames.tobytes()).hexdigest()[:16]
    large = stem.with_name(f"{stem.name}_x{factor}_{digest}.mp4")
    if not large.is_file():
        write_mp4(large, upscale(frames, factor) if factor > 1 else frames, fps=fps)
    for stale in stem.parent.glob(f"{glob_escape(stem.name)}_x*_*.mp4"):
        if stale != large:
            stale.unlink(missing_ok=True)
    return large


def remove_clip(clip: Path) -> None:
    """``clip`` and its enlarged copies (:func:`large_clip`), if they exist."""
    for path in [clip, *clip.parent.glob(f"{glob_escape(clip.stem)}_x*_*.mp4")]:
        path.unlink(missing_ok=True)


def clip_notes(session: GameSession | None) -> str:
    """A line for the status for each clip that could not be written since the last notes (the turn is played)."""
    failures = session.clip_failures() if session is not None else []
    folders = (session.output_dir, Path(session.output_dir).resolve()) if session is not None else ()
    return "".join(f"  \n**Clip not written:** {tell(failure, folders)}" for failure in failures)


def remove_turn_views(stem: Path) -> None:
    """What the page was given of the turn at ``stem``: its first frames and its whole clip at display size."""
    remove_clip(stem.with_name(f"{stem.name}_first.mp4"))
    for copy in stem.parent.glob(f"{glob_escape(stem.name)}_x*_*.mp4"):
        copy.unlink(missing_ok=True)


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
