# The README's two commands: `make conformance` (the main job) and `make test` (everything).
# Both set up .venv first: torch 2.13.0 before the rest, so pip takes the CPU wheel on disk
# instead of pulling a multi-GB CUDA build for an unpinned torch.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: setup conformance test lint bench conformance-vllm conformance-vllm-server clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(STAMP)

conformance: setup
	$(PY) -m pytest conformance --engine=reference $(ARGS)

test: setup lint
	TRITON_INTERPRET=1 $(PY) -m pytest tests conformance $(ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup
	$(PY) -m benchmarks.throughput $(ARGS)

conformance-vllm: setup
	$(VENV)/bin/tox -e conformance-vllm $(if $(ARGS),-- $(ARGS))

# The same vLLM environment, as a server: `vllm serve` on loopback, checked through the http adapter.
conformance-vllm-server: setup
	$(VENV)/bin/tox -e conformance-vllm --notest
	VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. .tox/conformance-vllm/bin/python -m conformance.serve vllm -p no:cacheprovider $(ARGS)

clean:
	rm -rf $(VENV) .tox .pytest_cache .hypothesis
