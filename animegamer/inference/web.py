"""The browser game (Gradio): structured fields or free text, the clip of each turn, the bars, the history.

Built by :func:`build_app` around a shared predictor + renderer; every browser tab has its own game
(a :class:`GameSession` in ``gr.State``, in its own directory). Input is validated before any model runs; a failed
turn or a bad save shows the error in the status line and leaves the game as it was.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from animegamer.inference.game import GameSession, ShotRenderer, StatePredictor
from animegamer.io import path_inside
from animegamer.states import STATE_MAX, TagError, parse_instruction

HISTORY_COLUMNS = ["turn", "instruction", "level", "social", "entertainment", "stamina delta", "stamina", "social bar",
                   "entertainment bar"]


def compose_instruction(character: str, adverb: str, motion: str, time: str, background: str, free_text: str) -> str:
    """Free text wins; otherwise the structured form from the fields (adverb joins motion, time joins background)."""
    if free_text and free_text.strip():
        return free_text.strip()
    motion_text = " ".join(x.strip() for x in (adverb, motion) if x and x.strip())
    place = " ".join(x.strip() for x in (time, background) if x and x.strip())
    if not (character or "").strip() and not motion_text and not place:
        return ""
    return f"Character: {(character or '').strip()}; Motion: {motion_text}; Background: {place}."


def history_rows(session: GameSession | None) -> list[list]:
    if session is None:
        return []
    return [[t.index, t.instruction, t.values.motion_level, t.values.social, t.values.entertainment, t.values.stamina,
             t.state.stamina, t.state.social, t.state.entertainment] for t in session.turns]


class WebGame:
    """The browser game's handlers, one method per button (what Gradio calls); each returns the new view.

    Every tab's game lives in its own directory under ``output_dir``, and the only files a handler ever hands
    to Gradio (which copies and serves them) are clips inside that directory: a loaded save's clip paths are
    dropped and its last clip is rendered again (:meth:`GameSession.load`), and :meth:`view` checks the path.
    """

    def __init__(self, predictor: StatePredictor, renderer: ShotRenderer | None, history_turns: int,
                 output_dir: str | Path, seed: int = 42):
        self.predictor, self.renderer, self.history_turns, self.seed = predictor, renderer, history_turns, seed
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def new_session(self) -> GameSession:
        folder = Path(tempfile.mkdtemp(prefix="game_", dir=self.output_dir))
        return GameSession(self.predictor, self.renderer, history_turns=self.history_turns, output_dir=folder,
                           seed=self.seed)

    def view(self, session: GameSession | None, status: str):
        """(session, status, clip path or None, stamina, social, entertainment, history rows)."""
        state = session.state if session is not None else None
        clip = None
        if session is not None and session.turns and session.turns[-1].clip:
            try:
                clip = str(path_inside(session.output_dir, session.turns[-1].clip))
            except ValueError:  # never reached by the game's own clips; a guard for whatever else set the path
                clip = None
        bars = [getattr(state, n) if state else 50 for n in ("stamina", "social", "entertainment")]
        return (session, status, clip, *bars, history_rows(session))

    def play(self, character, adverb, motion, time, background, free_text, session):
        text = compose_instruction(character, adverb, motion, time, background, free_text)
        try:
            parse_instruction(text)  # validated before any model runs
        except TagError as exc:
            return self.view(session, f"**Not played:** {exc}")
        session = session or self.new_session()
        try:
            turn = session.play(text)
        except Exception as exc:  # a turn may fail in a model; the game must survive it
            return self.view(session, f"**Turn failed:** {type(exc).__name__}: {exc}")
        v = turn.values
        return self.view(session, f"Turn {turn.index}: motion level {v.motion_level}, social {v.social}, "
                                  f"entertainment {v.entertainment}, stamina {v.stamina:+d}")

    def undo(self, session):
        if session is None or not session.turns:
            return self.view(session, "Nothing to undo.")
        turn = session.undo()
        return self.view(session, f"Undid turn {turn.index}.")

    def save(self, session):
        if session is None or not session.turns:
            return None, "Nothing to save yet."
        path = session.save(Path(session.output_dir) / "game.save")
        return str(path), f"Saved {len(session.turns)} turns."

    def load(self, file, session):
        """Load an uploaded save into a fresh directory; a bad save leaves the current game as it was."""
        if file is None:
            return self.view(session, "Choose a saved game file first.")
        folder = Path(tempfile.mkdtemp(prefix="game_", dir=self.output_dir))
        try:
            loaded = GameSession.load(file, self.predictor, self.renderer, output_dir=folder,
                                      history_turns=self.history_turns)
        except (ValueError, OSError) as exc:
            folder.rmdir()
            return self.view(session, f"**Not loaded:** {exc}")
        status = f"Loaded {len(loaded.turns)} turns."
        if loaded.turns:
            try:
                loaded.render_turn(loaded.turns[-1])
            except Exception as exc:  # the game is loaded; only its picture failed
                status += f" The last clip could not be rendered ({type(exc).__name__}: {exc})."
        return self.view(loaded, status)


def build_app(predictor: StatePredictor, renderer: ShotRenderer | None, history_turns: int, output_dir: str | Path,
              seed: int = 42, title: str = "AnimeGamer"):
    import gradio as gr

    game = WebGame(predictor, renderer, history_turns, output_dir, seed=seed)
    with gr.Blocks(title=title) as app:
        gr.Markdown(f"# {title}\nDescribe what your character does next; the game renders the shot and updates "
                    "the character's stamina, social and entertainment.")
        session_state = gr.State(None)
        with gr.Row():
            character = gr.Textbox(label="Character", value="Qiqi")
            adverb = gr.Textbox(label="Adverb", placeholder="gently")
            motion = gr.Textbox(label="Motion", placeholder="lie down")
            time = gr.Textbox(label="Time", placeholder="night")
            background = gr.Textbox(label="Background", placeholder="bedroom")
        free_text = gr.Textbox(label="…or free text (overrides the fields)")
        with gr.Row():
            play_button = gr.Button("Play turn", variant="primary")
            undo_button = gr.Button("Undo")
            save_button = gr.Button("Save")
        status = gr.Markdown()
        with gr.Row():
            video = gr.Video(label="Clip", autoplay=True)
            with gr.Column():
                stamina = gr.Slider(0, STATE_MAX, value=50, label="Stamina", interactive=False)
                social = gr.Slider(0, STATE_MAX, value=50, label="Social", interactive=False)
                entertainment = gr.Slider(0, STATE_MAX, value=50, label="Entertainment", interactive=False)
        history = gr.Dataframe(headers=HISTORY_COLUMNS, label="History", interactive=False)
        with gr.Row():
            saved_file = gr.File(label="Saved game")
            load_file = gr.File(label="Load a saved game", type="filepath")
            load_button = gr.Button("Load")
        outputs = [session_state, status, video, stamina, social, entertainment, history]
        play_button.click(game.play, [character, adverb, motion, time, background, free_text, session_state], outputs,
                          api_name="play")
        undo_button.click(game.undo, [session_state], outputs, api_name="undo")
        save_button.click(game.save, [session_state], [saved_file, status], api_name="save")
        load_button.click(game.load, [load_file, session_state], outputs, api_name="load")
    return app
