"""The browser game streams a turn: the page gets the clip's first decoded frames before the whole clip (the Gradio
server's event stream, read with gradio_client; order, not time)."""

import os

import numpy as np
import pytest

from animegamer.config import load_config
from animegamer.data.video import read_video
from animegamer.game.build import build_session
from tests.helpers.game import TINY, tiny_overrides
from tests.helpers.gradio_app import launch

pytestmark = pytest.mark.usefixtures("one_thread")


def _path(video) -> str:
    return video["video"] if isinstance(video, dict) else video


def test_page_gets_the_first_frames_then_the_whole_clip(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path, monkeypatch):
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from gradio_client import Client

    from animegamer.game.browser import build_app

    # 17 frames = 5 latent frames: the VAE decodes them in two chunks, 9 frames then 8
    cfg = load_config(TINY, [*tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path / "play"),
                             "sampling.num_frames=17"])
    template = build_session(cfg)
    app = build_app(template.game, tmp_path / "web")
    launch(app, monkeypatch)
    try:
        client = Client(app.local_url, verbose=False)
        job = client.submit("Qiqi", "quickly", "run", "park", "", api_name="/play")
        job.result()
        views = job.outputs()
        empty = client.submit("", "", "", "", "", api_name="/play")
        empty.result()
        refused = empty.outputs()
    finally:
        app.close()
    assert len(views) == 2, [v[0] for v in views]
    (first_status, first_video, _, first_history), (status, video, _, history) = views
    assert first_status.startswith("Turn 0: the first 9 frames") and first_history["data"] == []  # not played yet
    assert status.startswith("Turn 0: motion level") and len(history["data"]) == 1
    first_frames, _ = read_video(_path(first_video))
    whole, _ = read_video(_path(video))
    assert first_frames.shape[0] == 9 and whole.shape[0] == 17 and first_frames.shape[1:] == whole.shape[1:]
    # the same pixels as the whole clip's first 9 frames, up to the two encodes' H.264 rounding
    difference = np.abs(first_frames.astype(np.int16) - whole[:9].astype(np.int16))
    other = np.abs(first_frames.astype(np.int16) - whole[8:].astype(np.int16))
    assert difference.mean() < 1.5 and other.mean() > 5 * difference.mean(), (difference.mean(), other.mean())
    assert len(refused) == 1 and "Not played" in refused[0][0]
