# Two commands on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TINY := checkpoints/tiny

.PHONY: install test demo lint tiny clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2

lint: $(STAMP)
	$(VENV)/bin/ruff check animegamer scripts tests *.py

$(TINY)/.built: $(STAMP) animegamer/tiny.py
	$(PY) scripts/make_tiny_checkpoints.py --out $(TINY)
	touch $@

tiny: $(TINY)/.built

# The demo game end to end on CPU (MLLM turn by turn, then the decoder) with the shipped SpriteWorld checkpoint
# (checkpoints/spriteworld/, trained on CPU by scripts/train_spriteworld.py; see its README.md).
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) inference_MLLM.py --config configs/spriteworld/inference.yaml output_dir=outputs/demo
	OMP_NUM_THREADS=1 $(PY) inference_Decoder.py --config configs/spriteworld/inference.yaml output_dir=outputs/demo

clean:
	rm -rf outputs $(TINY)
