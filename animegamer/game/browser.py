"""The browser game (Gradio): the world's words as choices (free text allowed), the clip of each turn shown large,
read-only bars, a history table that fits, a progress bar while a turn runs, and the clip's first frames on screen
while the rest of it decodes.

Built by :func:`build_app` around one shared :class:`AnimeGamer`; every browser tab has its own game
(a :class:`GameSession` in ``gr.State``, in its own directory). Input is validated before any model runs; a failed
turn or a bad save shows the error in the status line and leaves the game as it was. The choices, the example
instruction and the warnings about words the model never saw come from the checkpoint's vocabulary
(:mod:`animegamer.data.vocabulary`).

A turn streams: :meth:`WebGame.play` is a generator whose views Gradio sends to the page as they come. The turn runs
in a worker thread; when the VAE has decoded the clip's first latent-frame batch (:mod:`animegamer.sampling.streaming`:
9 of 17 frames) the page shows them (``turn_XXX_first_xN_<digest>.mp4``, looping), and the whole clip replaces them
as soon as it is decoded. What the page shows is written once, at display size, straight from the decoded frames
(:func:`display_clip`); the turn's own ``turn_XXX.gif`` and ``.mp4`` are written in the background meanwhile
(:class:`GameSession`'s writer), and a clip that could not be written is named in the next status line.

One action at a time per game (:meth:`GameSession.action`): Undo, Save, Load or Play pressed while a turn runs is
refused with a status line saying so, and the game is untouched; an action that fails anywhere (the display copy
included) waits for its turn's thread to end and leaves the game exactly as it was. A tab's game is freed when the
tab closes (its turns, its shot tensors, its folder); the models stay shared. :meth:`WebGame.shutdown` (the server's
SIGTERM) saves every open game's unsaved turns to ``game.save`` in its folder. Status lines never show the server's
paths: a file is named by its name alone (:func:`tell`).
"""

from __future__ import annotations

import contextvars
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from animegamer.data.vocabulary import Vocabulary
from animegamer.game.browser_view import (
    APP_CSS,  # noqa: F401  (app.py and the tests take it from here, with build_app)
    CLIP_HEIGHT,
    HISTORY_COLUMNS,
    HISTORY_WIDTHS,
    as_text,
    bars_html,
    clip_notes,
    compose_instruction,
    display_clip,
    history_rows,
    large_clip,
    remove_turn_views,
    tell,
)
from animegamer.game.session import SAVE_NAME, GameBusy, GameSession, clean_stale_temp, one_line, sweep_stale
from animegamer.game.turn import AnimeGamer, Progress, TurnEvents, clip_stem
from animegamer.io import check_regular_file, path_inside
from animegamer.states import TagError, parse_instruction

# the largest save a browser may upload, refused before it is read (app.py --max-upload-mb): 1 GiB holds the most
# turns a game holds (MAX_TURNS) in SpriteWorld, ~600 full-size turns (226 x 1920 float32 shots, 1.7 MB a turn)
MAX_UPLOAD_BYTES = 1 << 30
CLOSE_WAIT = 120.0  # seconds a closed tab or a stopping server waits for a running turn before freeing its game
WEB_COMMAND = "app.py (the browser game)"  # what a tab's directory lock names as its holder


class PageEvents(TurnEvents):
    """The browser's view of a running turn (in the turn's thread): stages to Gradio's progress bar, the first
    frames and the whole clip to the page's queue (``("frames", frames)``, ``("clip", frames)``)."""

    def __init__(self, page: queue.Queue, progress: Progress | None):
        self.page, self.progress = page, progress

    def stage(self, what: str, done: float) -> None:
        if self.progress is not None:
            self.progress(what, done)

    def first_frames(self, frames) -> None:
        self.page.put(("frames", frames))

    def clip(self, frames) -> None:
        self.page.put(("clip", frames))


class WebGame:
    """The browser game's handlers, one method per button (what Gradio calls); each returns the new view.

    Every tab's game lives in its own directory under ``output_dir`` (held by the game: :meth:`GameSession.hold`),
    and the only files a handler ever hands to Gradio (which copies and serves them) are clips inside that
    directory: a loaded save's clip paths are dropped and its last clip is rendered again (:meth:`GameSession.load`),
    and :meth:`view` checks the path. The open games are :attr:`games`; :meth:`close` frees one (a closed tab),
    :meth:`shutdown` saves them all (the server stopping). ``upload_dir`` is where the server keeps uploads: a save
    loaded from there is removed once read; an upload over ``max_upload_bytes`` is refused unread.
    """

    def __init__(self, game: AnimeGamer, output_dir: str | Path, vocabulary: Vocabulary | None = None,
                 upload_dir: str | Path | None = None, max_upload_bytes: int = MAX_UPLOAD_BYTES):
        self.game, self.vocabulary = game, vocabulary
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.upload_dir = Path(upload_dir) if upload_dir is not None else None
        self.max_upload_bytes = max_upload_bytes
        self.games: dict[int, GameSession] = {}  # the open games by id(): what shutdown saves and close frees
        self.stopping = False  # the server is stopping: shutdown() saves the games, close() leaves them be
        self._games_lock = threading.Lock()
        sweep_stale(self.output_dir, "game_*", WEB_COMMAND)  # what the tabs of a killed server were writing

    def tell(self, text: object, *more: str | Path) -> str:
        """:func:`tell` with the server's folders: the games', the uploads', the temp folder, and ``more``."""
        return tell(text, (self.output_dir, self.output_dir.resolve(), self.upload_dir, tempfile.gettempdir(),
                           Path(tempfile.gettempdir()).resolve(), *more))

    def _open(self, session: GameSession) -> GameSession:
        session.hold(WEB_COMMAND)
        with self._games_lock:
            self.games[id(session)] = session
        return session

    def new_session(self) -> GameSession:
        folder = Path(tempfile.mkdtemp(prefix="game_", dir=self.output_dir))
        return self._open(GameSession(self.game, output_dir=folder))

    def close(self, session: GameSession | None) -> None:
        """Free a game whose tab is gone: once its running action (if any) has ended, its clips written, its turns
        and their tensors dropped and its folder removed (what the player kept is what they downloaded)."""
        if session is None or self.stopping:  # a stopping server's games are saved, not freed (Gradio drops
            return  # every tab's state as it closes)
        with self._games_lock:
            if self.games.pop(id(session), None) is None:
                return  # not one of ours, or closed already
        try:
            with session.action("closing the game", wait=CLOSE_WAIT):  # the tab's last turn ends first
                session.close()
        except GameBusy:  # a turn that never ends: its folder goes all the same, its tensors with the game object
            session.release()
        shutil.rmtree(session.output_dir, ignore_errors=True)

    def shutdown(self, timeout: float = CLOSE_WAIT) -> list[str]:
        """The server is stopping (set :attr:`stopping` before closing it, so that the tabs it drops keep their
        games for this): every open game's unsaved turns saved to ``game.save`` in its folder (after its
        running action, at most ``timeout`` seconds), its stale temp files removed and its folder let go. Returns
        one line per game saved or not saved."""
        lines = []
        self.stopping = True
        with self._games_lock:
            games, self.games = list(self.games.values()), {}
        for session in games:
            try:
                with session.action("saving before the server stops", wait=timeout):
                    if session.unsaved and session.turns:
                        path = session.save(Path(session.output_dir) / SAVE_NAME)
                        lines.append(f"saved {len(session.turns)} turns to {path}")
            except (ValueError, OSError, GameBusy) as exc:
                lines.append(f"error: {one_line(exc)}")
            session.wait()
            clean_stale_temp(session.output_dir)  # held still: nothing of this game writes any more
            session.release()
        return lines

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
        then the played turn, or the reason it was not played (the game as it was)."""
        text = compose_instruction(character, adverb, motion, background, free_text)
        try:
            parse_instruction(text)  # validated before any model runs
        except TagError as exc:
            yield self.view(session, f"**Not played:** {as_text(exc)}")
            return
        session = session or self.new_session()
        index = len(session.turns)
        try:
            with session.action("a turn"):
                yield from self._turn(session, text, progress)
        except GameBusy as exc:
            yield self.view(session, f"**Not played:** {self.tell(exc)}")
        except Exception as exc:  # a model, the display copy, a full disk: the action put the game back as it was
            remove_turn_views(clip_stem(session.output_dir, index))
            yield self.view(session, f"**Turn failed:** {type(exc).__name__}: {self.tell(exc)}; the game is as it was "
                                     f"({len(session.turns)} turns).")

    def _turn(self, session: GameSession, text: str, progress: Progress | None) -> Iterator[tuple]:
        """The views of a turn of ``session``, held by the caller; raises what failed, but only once the turn's
        thread has ended (no turn goes on in the background of a failed action)."""
        warnings = self.vocabulary.unknown_words(text) if self.vocabulary else []
        # the turn index, bars and history while the turn runs (the worker thread changes them)
        index, before = len(session.turns), self.view(session, "", notes=False)
        events: queue.Queue = queue.Queue()

        def turn_worker():
            try:
                events.put(("turn", session.play(text, PageEvents(events, progress))))
            except BaseException as exc:  # a turn may fail in a model; the game must survive it
                events.put(("failed", exc))

        # the copied context carries Gradio's progress tracker into the thread
        worker = threading.Thread(target=contextvars.copy_context().run, args=(turn_worker,), daemon=True)
        worker.start()
        try:
            stem, shown = clip_stem(session.output_dir, index), None
            while True:
                kind, value = events.get()
                if kind == "frames":  # (t, H, W, 3) uint8: the first decoded chunk
                    first = display_clip(value, stem.with_name(f"{stem.name}_first"), session.game.renderer.fps)
                    _, status, clip, _, _ = self.view(session, f"Turn {index}: the first {len(value)} frames; the "
                                                               "rest are decoding…", clip=first, notes=False)
                    yield (session, status, clip, *before[3:])
                elif kind == "clip":  # the whole clip, decoded: on the page while its files are written
                    shown = display_clip(value, stem, session.game.renderer.fps)
                elif kind == "failed":  # render_turn removed its clip; the caller removes what the page got
                    raise value
                else:
                    break
        finally:
            worker.join()  # a failure here (a display copy) waits for the turn, which the action then takes back
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
        try:
            with session.action("undo"):
                turn = session.undo()  # waits for the clips being written, removes the turn's clip
        except GameBusy as exc:
            return self.view(session, f"**Not undone:** {self.tell(exc)}")
        remove_turn_views(clip_stem(session.output_dir, turn.index))
        turn.shown = ""
        return self.view(session, f"Undid turn {turn.index}.")

    def save(self, session):
        if session is None or not session.turns:
            return None, "Nothing to save yet."
        try:
            with session.action("a save"):
                path = session.save(Path(session.output_dir) / SAVE_NAME)
        except (ValueError, OSError, GameBusy) as exc:  # a full disk, a file size limit, a turn running
            return None, f"**Not saved:** {self.tell(exc)}"
        return str(path), f"Saved {len(session.turns)} turns." + clip_notes(session)

    def load(self, file, session):
        """Load an uploaded save into a fresh directory; a bad save, or a turn running in the current game, leaves
        the current game as it was. The game it replaces is freed (:meth:`close`)."""
        if file is None:
            return self.view(session, "Choose a saved game file first.")
        if session is not None and session.busy:
            return self.view(session, "**Not loaded:** a turn is running in this game; load when it has finished")
        folder = Path(tempfile.mkdtemp(prefix="game_", dir=self.output_dir))
        try:
            check_regular_file(file, self.max_upload_bytes)  # before a byte is read
            loaded = self._open(GameSession.load(file, self.game, output_dir=folder))
        except (ValueError, OSError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            return self.view(session, f"**Not loaded:** {self.tell(exc, Path(file).parent)}")
        finally:
            self.forget_upload(file)
        status = f"Loaded {len(loaded.turns)} turns."
        if loaded.turns:
            try:
                last = loaded.turns[-1]
                frames = loaded.render_turn(last)  # its files are written in the background
                if frames is not None:
                    last.shown = str(display_clip(frames, clip_stem(folder, last.index), loaded.game.renderer.fps))
            except Exception as exc:  # the game is loaded; only its picture failed
                status += f" The last clip could not be rendered ({type(exc).__name__}: {self.tell(exc)})."
        self.close(session)
        return self.view(loaded, status)

    def forget_upload(self, file) -> None:
        """Remove an uploaded file once read, if the server keeps it (``upload_dir``); a file elsewhere stays."""
        if self.upload_dir is None:
            return
        try:
            upload = path_inside(self.upload_dir, file)
        except ValueError:
            return
        upload.unlink(missing_ok=True)
        try:
            upload.parent.rmdir()  # Gradio keeps each upload in a folder of its own
        except OSError:
            pass


def build_app(game: AnimeGamer, output_dir: str | Path, title: str = "AnimeGamer",
              vocabulary: Vocabulary | None = None, max_upload_bytes: int = MAX_UPLOAD_BYTES):
    """The Gradio app; launch it with ``css=APP_CSS`` (pixel-sharp clip) and ``max_file_size=max_upload_bytes``.
    Its :class:`WebGame` is ``app.web`` (what a stopping server saves: :meth:`WebGame.shutdown`). A tab's game is
    freed when the tab closes (Gradio's ``unload``), and Gradio's copies of uploads and served files are deleted
    after an hour and when the server stops (``delete_cache``)."""
    import gradio as gr
    from gradio.utils import get_upload_folder

    web = WebGame(game, output_dir, vocabulary=vocabulary, upload_dir=get_upload_folder(),
                  max_upload_bytes=max_upload_bytes)
    tabs: dict[str, GameSession] = {}  # each open tab's game, by Gradio's session hash: freed when the tab closes

    def bind(request: gr.Request | None, view: tuple) -> tuple:
        if request is not None and request.session_hash and view[0] is not None:
            tabs[request.session_hash] = view[0]
        return view

    def closed(request: gr.Request):
        web.close(tabs.pop(request.session_hash, None) if request is not None else None)

    def choice(label: str, entries: tuple[str, ...], value: str | None = None):
        """A dropdown of the world's words that takes any other text too."""
        return gr.Dropdown(choices=list(entries), value=value, label=label, allow_custom_value=True, filterable=True,
                           elem_id=f"field-{label.lower()}")

    # Gradio finds its progress tracker by this default value and passes a live one in its place; a generator:
    # Gradio sends each view (the first frames, then the whole turn) to the page as it comes
    def play(character, adverb, motion, background, free_text, session, request: gr.Request,
             progress=gr.Progress()):  # noqa: B008
        for view in web.play(character, adverb, motion, background, free_text, session,
                             progress=lambda stage, done: progress(done, desc=stage)):
            yield bind(request, view)

    def undo(session, request: gr.Request):
        return bind(request, web.undo(session))

    def load(file, session, request: gr.Request):
        return bind(request, web.load(file, session))

    for handler in (play, undo, load, closed):  # Gradio hands a gr.Request to a parameter typed so; the module's
        handler.__annotations__ = {"request": gr.Request}  # postponed annotations are strings it cannot resolve

    words = vocabulary or Vocabulary((), (), (), ())
    example = vocabulary.placeholder() if vocabulary else "Character: Qiqi; Motion: happily eat; Background: park."
    with gr.Blocks(title=title, delete_cache=(3600, 3600)) as app:
        gr.Markdown(f"# {title}\nChoose what your character does next (or type your own words); the game renders the "
                    "shot and updates the character's stamina, social and entertainment.")
        session_state = gr.State(None, delete_callback=web.close)  # Gradio drops a closed tab's state later
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
        undo_button.click(undo, [session_state], outputs, api_name="undo")
        save_button.click(web.save, [session_state], [saved_file, status], api_name="save")
        load_button.click(load, [load_file, session_state], outputs, api_name="load")
        app.unload(closed)
    app.web = web
    return app
