"""Launching a Gradio app in the test process on a machine that may be busy.

Gradio's ``launch`` checks that the new server answers on localhost (``gradio.networking.url_ok``: a few requests with
a 3 s timeout, and a timeout counts as "not accessible") and refuses to go on otherwise; on two cores shared with
other test workers a first answer can take longer. Here the same check is asked again until it passes or a minute has
gone, so only a server that really does not answer fails the test.
"""

from __future__ import annotations

import time

LAUNCH_PATIENCE_S = 60.0


def launch(app, monkeypatch) -> None:
    """``app.launch`` on 127.0.0.1 without blocking, with a patient localhost check."""
    from gradio import networking

    check = networking.url_ok

    def patient_url_ok(url: str) -> bool:
        deadline = time.monotonic() + LAUNCH_PATIENCE_S
        while not check(url):
            if time.monotonic() > deadline:
                return False
        return True

    monkeypatch.setattr(networking, "url_ok", patient_url_ok)
    app.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
