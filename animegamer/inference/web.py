"""The browser game (Gradio): the world's words as choices (free text allowed), the clip of each turn shown large,
read-only bars, a history table that fits, a progress bar while a turn runs, and the clip's first frames on screen
while the rest of it decodes.

Built by :func:`build_app` around one shared :class:`AnimeGamer`; every browser tab has its own game
(a :class:`GameSession` in ``gr.State``, in its own directory). Input is validated before any model runs; a failed
turn or a bad save shows the error in the status line and leaves the game as it was. The choices, the example
instruction and the warnings about words the model never saw come from the checkpoint's vocabulary
(:mod:`animegamer.inference.vocabulary`).

A turn streams: :meth:`WebGame.play` is a generator whose views Gradio sends to the page as they come. The turn runs
in a worker thread; when the VAE has decoded the clip's first latent-frame batch (:mod:`animegamer.sampling.streaming`:
9 of 17 frames) the page shows them (``turn_XXX_first_xN_<digest>.mp4``, looping), and the whole clip replaces them
as soon as it is decoded. What the page shows is written once, at display size, straight from the decoded frames
(:func:`display_clip`); the turn's own ``turn_XXX.gif`` and ``.mp4`` are written in the background meanwhile
(:class:`GameSession`'s writer), and a clip that could not be written is named in the next status line.
"""

from __future__ import annotations

import contextvars
import hashlib
import html
import queue
import string
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from animegamer.data.video import VideoReadError, probe_video, read_video, write_mp4
from animegamer.inference.contact_sheet import readable_factor, upscale
from animegamer.inference.game import SAVE_NAME, GameSession
from animegamer.inference.turn import AnimeGamer, Progress, clip_stem
from animegamer.inference.vocabulary import Vocabulary
from animegamer.io import path_inside
from animegamer.states import STATE_MAX, CharacterState, TagError, parse_instruction

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
    return "".join(f"  \n**Clip not written:** {as_text(failure)}" for failure in failures)


def remove_turn_views(stem: Path) -> None:
    """What the page was given of the turn at ``stem``: its first frames and its whole clip at display size."""
    remove_clip(stem.with_name(f"{stem.name}_first.mp4"))
    for copy in stem.parent.glob(f"{glob_escape(stem.name)}_x*_*.mp4"):
        copy.unlink(missing_ok=True)


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


class WebGame:
    """The browser game's handlers, one method per button (what Gradio calls); each returns the new view.

    Every tab's game lives in its own directory under ``output_dir``, and the only files a handler ever hands
    to Gradio (which copies and serves them) are clips inside that directory: a loaded save's clip paths are
    dropped and its last clip is rendered again (:meth:`GameSession.load`), and :meth:`view` checks the path.
    """

    def __init__(self, game: AnimeGamer, output_dir: str | Path, vocabulary: Vocabulary | None = None):
        self.game, self.vocabulary = game, vocabulary
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def new_session(self) -> GameSession:
        folder = Path(tempfile.mkdtemp(prefix="game_", dir=self.output_dir))
        return GameSession(self.game, output_dir=folder)

    def view(self, session: GameSession | None, status: str, clip: str | Path | None = None, notes: bool = True):
        """(session, status, clip path or None, bars HTML, history rows). ``clip`` is a file at display size
        (:func:`display_clip`); by default the last turn's as the page showed it, or its clip enlarged
        (:func:`large_clip`). With ``notes``, the clips that could not be written since the last notes are named
        after the status."""
        if notes:
            status += clip_notes(session)
        large = clip is not None
        if clip is None and session is not None and session.turns:
            last = session.turns[-1]
            clip, large = (last.shown, True) if last.shown else (last.clip or None, False)
        if clip is not None:
            try:
                clip = path_inside(session.output_dir, clip)
                clip = str(clip if large else large_clip(clip))
            except ValueError:  # never reached by the game's own clips; a guard for whatever else set the path
                clip = None
        return (session, status, clip, bars_html(session), history_rows(session))

    def play(self, character, adverb, motion, background, free_text, session,
             progress: Progress | None = None) -> Iterator[tuple]:
        """The views of one turn: its first frames while the rest decode (a clip that decodes in several chunks),
        then the played turn, or the reason it was not played."""
        text = compose_instruction(character, adverb, motion, background, free_text)
        try:
            parse_instruction(text)  # validated before any model runs
        except TagError as exc:
            yield self.view(session, f"**Not played:** {as_text(exc)}")
            return
        session = session or self.new_session()
        warnings = self.vocabulary.unknown_words(text) if self.vocabulary else []
        # the turn index, bars and history while the turn runs (the worker thread changes them)
        index, before = len(session.turns), self.view(session, "", notes=False)
        events: queue.Queue = queue.Queue()

        def turn_worker():
            try:
                events.put(("turn", session.play(text, progress, lambda frames: events.put(("frames", frames)),
                                                 lambda frames: events.put(("clip", frames)))))
            except Exception as exc:  # a turn may fail in a model; the game must survive it
                events.put(("failed", exc))

        # the copied context carries Gradio's progress tracker into the thread
        threading.Thread(target=contextvars.copy_context().run, args=(turn_worker,), daemon=True).start()
        stem, shown = clip_stem(session.output_dir, index), None
        while True:
            kind, value = events.get()
            if kind == "frames":  # (t, H, W, 3) uint8: the first decoded chunk
                first = display_clip(value, stem.with_name(f"{stem.name}_first"), session.game.renderer.fps)
                _, status, clip, _, _ = self.view(session, f"Turn {index}: the first {len(value)} frames; the rest "
                                                           "are decoding…", clip=first,
                                                  notes=False)
                yield (session, status, clip, *before[3:])
            elif kind == "clip":  # the whole clip, decoded: on the page while its files are written
                shown = display_clip(value, stem, session.game.renderer.fps)
            elif kind == "failed":  # nothing of the turn stays: render_turn removed its clip, this what the page got
                remove_turn_views(stem)
                yield self.view(session, f"**Turn failed:** {type(value).__name__}: {as_text(value)}; the game is as "
                                         f"it was ({len(session.turns)} turns).")
                return
            else:
                break
        if shown is not None:
            value.shown = str(shown)
        v = value.values
        status = (f"Turn {value.index}: motion level {v.motion_level}, social {v.social}, "
                  f"entertainment {v.entertainment}, stamina {v.stamina:+d}")
        if warnings:
            status += "  \n*The model guessed: " + as_text("; ".join(warnings)) + ".*"
        yield self.view(session, status)

    def undo(self, session):
        if session is None or not session.turns:
            return self.view(session, "Nothing to undo.")
        turn = session.undo()  # waits for the clips being written, removes the turn's clip
        remove_turn_views(clip_stem(session.output_dir, turn.index))
        turn.shown = ""
        return self.view(session, f"Undid turn {turn.index}.")

    def save(self, session):
        if session is None or not session.turns:
            return None, "Nothing to save yet."
        try:
            path = session.save(Path(session.output_dir) / SAVE_NAME)
        except (ValueError, OSError) as exc:  # a full disk, or something not a save in the tab's folder
            return None, f"**Not saved:** {as_text(exc)}"
        return str(path), f"Saved {len(session.turns)} turns." + clip_notes(session)

    def load(self, file, session):
        """Load an uploaded save into a fresh directory; a bad save leaves the current game as it was."""
        if file is None:
            return self.view(session, "Choose a saved game file first.")
        folder = Path(tempfile.mkdtemp(prefix="game_", dir=self.output_dir))
        try:
            loaded = GameSession.load(file, self.game, output_dir=folder)
        except (ValueError, OSError) as exc:
            folder.rmdir()
            return self.view(session, f"**Not loaded:** {as_text(exc)}")
        status = f"Loaded {len(loaded.turns)} turns."
        if loaded.turns:
            try:
                last = loaded.turns[-1]
                frames = loaded.render_turn(last)  # its files are written in the background
                if frames is not None:
                    last.shown = str(display_clip(frames, clip_stem(folder, last.index), loaded.game.renderer.fps))
            except Exception as exc:  # the game is loaded; only its picture failed
                status += f" The last clip could not be rendered ({type(exc).__name__}: {as_text(exc)})."
        return self.view(loaded, status)


def build_app(game: AnimeGamer, output_dir: str | Path, title: str = "AnimeGamer",
              vocabulary: Vocabulary | None = None):
    """The Gradio app; launch it with ``css=APP_CSS`` (pixel-sharp clip)."""
    import gradio as gr

    web = WebGame(game, output_dir, vocabulary=vocabulary)

    def choice(label: str, entries: tuple[str, ...], value: str | None = None):
        """A dropdown of the world's words that takes any other text too."""
        return gr.Dropdown(choices=list(entries), value=value, label=label, allow_custom_value=True, filterable=True,
                           elem_id=f"field-{label.lower()}")

    # Gradio finds its progress tracker by this default value and passes a live one in its place; a generator:
    # Gradio sends each view (the first frames, then the whole turn) to the page as it comes
    def play(character, adverb, motion, background, free_text, session, progress=gr.Progress()):  # noqa: B008
        yield from web.play(character, adverb, motion, background, free_text, session,
                             progress=lambda stage, done: progress(done, desc=stage))

    words = vocabulary or Vocabulary((), (), (), ())
    example = vocabulary.placeholder() if vocabulary else "Character: Qiqi; Motion: happily eat; Background: park."
    with gr.Blocks(title=title) as app:
        gr.Markdown(f"# {title}\nChoose what your character does next (or type your own words); the game renders the "
                    "shot and updates the character's stamina, social and entertainment.")
        session_state = gr.State(None)
        with gr.Row():
            character = choice("Character", words.characters, words.characters[0] if words.characters else None)
            adverb = choice("Adverb", words.adverbs)
            motion = choice("Motion", words.motions)
            background = choice("Background", words.backgrounds)
        free_text = gr.Textbox(label="…or a whole instruction (overrides the fields)", placeholder=example,
                               elem_id="free-text")
        with gr.Row():
            play_button = gr.Button("Play turn", variant="primary", elem_id="play")
            undo_button = gr.Button("Undo", elem_id="undo")
            save_button = gr.Button("Save", elem_id="save")
        # no LaTeX either: a status quotes players' and files' text (as_text), which must read as typed
        status = gr.Markdown(elem_id="status", latex_delimiters=[])
        with gr.Row():
            video = gr.Video(label="Clip", autoplay=True, loop=True, height=CLIP_HEIGHT, elem_id="clip", scale=3)
            with gr.Column(scale=1):
                bars = gr.HTML(bars_html(None), label="Character", elem_id="bars")
        # "str": instructions from players and saves are shown as text, never as Markdown or HTML
        history = gr.Dataframe(headers=HISTORY_COLUMNS, datatype="str", label="History", interactive=False, wrap=True,
                               column_widths=HISTORY_WIDTHS, elem_id="history")
        with gr.Row():
            saved_file = gr.File(label="Saved game", elem_id="saved-file")
            load_file = gr.File(label="Load a saved game", type="filepath", elem_id="load-file")
            load_button = gr.Button("Load", elem_id="load")
        outputs = [session_state, status, video, bars, history]
        play_button.click(play, [character, adverb, motion, background, free_text, session_state], outputs,
                          api_name="play")
        undo_button.click(web.undo, [session_state], outputs, api_name="undo")
        save_button.click(web.save, [session_state], [saved_file, status], api_name="save")
        load_button.click(web.load, [load_file, session_state], outputs, api_name="load")
    return app
