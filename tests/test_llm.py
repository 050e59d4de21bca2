import numpy as np
import pytest

from animegamer.llm import LLMError, OpenAICompatibleBackend, make_backend
from tests.helpers.llm_server import FakeChatServer


def test_openai_backend_round_trip_with_images_and_retry():
    with FakeChatServer(["HTTP500", "hello"]) as server:
        backend = make_backend({"type": "openai", "base_url": server.base_url, "model": "m", "retries": 1})
        image = np.zeros((8, 8, 3), np.uint8)
        answer = backend.chat([{"role": "user", "content": "describe"}], images=[image])
        assert answer == "hello"
        sent = server.requests[-1]
        assert sent["model"] == "m"
        parts = sent["messages"][-1]["content"]
        assert parts[0] == {"type": "text", "text": "describe"}
        assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_openai_backend_errors():
    backend = OpenAICompatibleBackend("http://127.0.0.1:9/v1", retries=0, timeout=2)
    with pytest.raises(LLMError, match="127.0.0.1:9"):
        backend.chat([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="backend type"):
        make_backend({"type": "nope"})
