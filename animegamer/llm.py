"""Chat backends for the captioner, the benchmark writer and the LLM judge.

Two backends with one method, ``chat(messages, images=None, max_tokens, temperature) -> str``:

- :class:`OpenAICompatibleBackend`: any server speaking ``POST {base_url}/chat/completions`` (vLLM, LMDeploy,
  llama.cpp server, OpenAI itself). Images are sent inline as base64 PNG data URLs.
- :class:`TransformersBackend`: a local transformers model directory (text or vision-language), loaded with
  ``from_pretrained``; images go through the model's processor and chat template.

``make_backend({"type": "openai", "base_url": ..., "model": ...})`` builds either from a config dict.
"""

from __future__ import annotations

import base64
import io
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np


class LLMError(RuntimeError):
    """The backend could not produce an answer (connection, HTTP status, malformed response)."""


def _png_data_url(image: Any) -> str:
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@dataclass
class OpenAICompatibleBackend:
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    model: str = "default"
    api_key: str = ""
    timeout: float = 120.0
    retries: int = 2  # network retries (answers that fail validation are retried by the caller)

    def chat(self, messages: list[dict], images: list | None = None, max_tokens: int = 512,
             temperature: float = 0.2) -> str:
        messages = [dict(m) for m in messages]
        if images:
            last = messages[-1]
            content = [{"type": "text", "text": last["content"]}]
            content += [{"type": "image_url", "image_url": {"url": _png_data_url(im)}} for im in images]
            last["content"] = content
        body = json.dumps(
            {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        error: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                request = urllib.request.Request(url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    payload = json.loads(response.read().decode())
                return str(payload["choices"][0]["message"]["content"])
            except urllib.error.HTTPError as exc:
                error = LLMError(f"{url}: HTTP {exc.code} {exc.reason}")
                if exc.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                error = LLMError(f"{url}: {exc}")
            except (KeyError, IndexError, TypeError, json.JSONDecodeError) as exc:
                raise LLMError(f"{url}: malformed response ({exc})") from exc
            time.sleep(0.2 * (attempt + 1))
        raise error  # type: ignore[misc]


class TransformersBackend:
    """A local chat model (``AutoModelForImageTextToText`` if it has a vision tower, else causal LM)."""

    def __init__(self, path: str, device: str = "cpu", dtype: str = "auto"):
        from pathlib import Path

        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

        if not Path(path).is_dir():
            raise FileNotFoundError(f"local model directory not found: {path}")
        config = AutoConfig.from_pretrained(path)
        self.vision = hasattr(config, "vision_config")
        torch_dtype = {"auto": "auto", "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        model_cls = AutoModelForImageTextToText if self.vision else AutoModelForCausalLM
        self.model = model_cls.from_pretrained(path, dtype=torch_dtype).to(device).eval()
        self.processor = AutoProcessor.from_pretrained(path)
        self.device = device

    def chat(self, messages: list[dict], images: list | None = None, max_tokens: int = 512,
             temperature: float = 0.2) -> str:
        import torch
        from PIL import Image

        if images and not self.vision:
            raise LLMError("this local model has no vision tower; images cannot be passed")
        messages = [dict(m) for m in messages]
        pil = [Image.fromarray(im) if isinstance(im, np.ndarray) else im for im in (images or [])]
        if self.vision:
            last = messages[-1]
            last["content"] = [*({"type": "image"} for _ in pil), {"type": "text", "text": last["content"]}]
            messages = [
                m if isinstance(m["content"], list) else {**m, "content": [{"type": "text", "text": m["content"]}]}
                for m in messages
            ]
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = self.processor(text=prompt, images=pil or None, return_tensors="pt") if self.vision else \
            tokenizer(prompt, return_tensors="pt")
        inputs = inputs.to(self.device)
        with torch.no_grad():
            out = self.model.generate(
                **inputs, max_new_tokens=max_tokens, do_sample=temperature > 0, temperature=temperature or None
            )
        return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def make_backend(spec: dict[str, Any]):
    """Build a backend from a config dict: ``{"type": "openai", "base_url", "model", "api_key"}`` or
    ``{"type": "transformers", "path", "device", "dtype"}``."""
    spec = dict(spec)
    kind = spec.pop("type", None)
    if kind == "openai":
        return OpenAICompatibleBackend(**spec)
    if kind == "transformers":
        return TransformersBackend(**spec)
    raise ValueError(f"backend type {kind!r} is not one of ['openai', 'transformers']")
