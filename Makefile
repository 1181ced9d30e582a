# Two commands set everything up on a fresh machine: `make build` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    ?= out
JOBS   ?= 2

.PHONY: build test install bench bench-plan bench-emulator bench-build bench-diff gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The main job with the default policy.
build: $(STAMP)
	$(BIN)/topkgen plan

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: bench-plan bench-emulator

bench-plan: $(STAMP)
	$(BIN)/python benchmarks/bench_cli.py plan

clean:
	rm -rf $(OUT) build dist *.egg-info

bench-emulator: $(STAMP)
	$(BIN)/python benchmarks/bench_emulator.py
