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

# The embedded default: the demo game end to end (MLLM turn by turn, then the decoder) on CPU with tiny models.
demo: $(TINY)/.built
	$(PY) inference_MLLM.py --config configs/tiny/inference.yaml output_dir=outputs/demo mllm_checkpoint=
	$(PY) inference_Decoder.py --config configs/tiny/inference.yaml output_dir=outputs/demo decoder_checkpoint=

clean:
	rm -rf outputs $(TINY)
