# On a fresh machine: `make test`, `make demo`, then `make play` (terminal) or `make app` (browser).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TINY := checkpoints/tiny

# the shipped SpriteWorld world: the one inference config whose weights come with the repository
PLAY_CONFIG := configs/spriteworld/inference.yaml
# apt-get needs root: sudo (without a password prompt) when not root
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: install test test-fast browser demo demo-fast play app lint tiny clean

$(STAMP): pyproject.toml
	@echo "installing the pinned dependencies into $(VENV) (the first time takes several minutes)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Chromium + its WebDriver from the distribution's packages, for tests/test_browser.py (Debian/Ubuntu; skipped with
# a reason where they cannot be installed)
browser:
	@command -v chromedriver >/dev/null 2>&1 || { echo "installing chromium + chromium-driver (apt) for the browser test"; \
	  $(SUDO) sh -c 'apt-get update -qq && apt-get install -y -qq chromium chromium-driver' >/dev/null 2>&1 || \
	  echo "could not install chromium + chromium-driver: tests/test_browser.py will be skipped"; }

test: $(STAMP) browser
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=30

# quick iteration: everything but the end-to-end runs (marked `slow` at the test)
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check animegamer scripts research tests *.py
	$(VENV)/bin/lint-imports

$(TINY)/.built: $(STAMP) animegamer/tiny.py
	$(PY) scripts/make_tiny_checkpoints.py --out $(TINY)
	touch $@

tiny: $(TINY)/.built

# The demo game end to end on CPU (MLLM turn by turn, then the decoder) with the shipped SpriteWorld checkpoint
# (checkpoints/spriteworld/, trained on CPU by scripts/spriteworld/train.py; see its README.md).
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) inference_MLLM.py --config configs/spriteworld/inference.yaml output_dir=outputs/demo
	OMP_NUM_THREADS=1 $(PY) inference_Decoder.py --config configs/spriteworld/inference.yaml output_dir=outputs/demo

# The same game rendered by the shipped 2-step stage (d) student (checkpoints/spriteworld/stage_d): 2 transformer
# calls per clip instead of 40, no CFG; decoded by the shipped stage (e) small causal decoder instead of the VAE
demo-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) inference_MLLM.py --config configs/spriteworld/inference.yaml output_dir=outputs/demo_fast
	OMP_NUM_THREADS=1 $(PY) inference_Decoder.py --config configs/spriteworld/inference.yaml output_dir=outputs/demo_fast \
	    sampling.preset=distilled decoder_checkpoint=checkpoints/spriteworld/stage_d sampling.vae=small

# Play the shipped SpriteWorld world on CPU: in the terminal, or in the browser at http://127.0.0.1:7860
play: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m animegamer.play --config $(PLAY_CONFIG)

app: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) app.py --config $(PLAY_CONFIG)

clean:
	rm -rf outputs $(TINY)
