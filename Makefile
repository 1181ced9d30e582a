# Two commands set everything up on a fresh machine: `make build` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    ?= out
JOBS   ?= 2

.PHONY: build build-legacy test install bench bench-plan bench-emulator bench-build bench-diff bench-kernels gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The main job with the default policy: plan, then compile the bundle into $(OUT)/.
build: $(STAMP)
	$(BIN)/topkgen plan --format json > /dev/null
	$(BIN)/topkgen build --out $(OUT) -j $(JOBS)

# The old exact-N grid, for comparison (CI builds it too).
build-legacy: $(STAMP)
	$(BIN)/topkgen build --policy policies/legacy/exact_n_grid.yaml --out $(OUT)-legacy -j $(JOBS)

# Tests share one compile cache per checkout so pytest-xdist workers reuse each other's work.
test: $(STAMP)
	TOPKGEN_CACHE_DIR=$(CURDIR)/.cache $(BIN)/python -m pytest -q -n $(JOBS)

bench: bench-plan bench-diff bench-emulator bench-build bench-kernels

bench-plan: $(STAMP)
	$(BIN)/python benchmarks/bench_cli.py plan

bench-diff: $(STAMP)
	$(BIN)/python benchmarks/bench_cli.py diff

clean:
	rm -rf $(OUT) $(OUT)-legacy .cache build dist *.egg-info

bench-emulator: $(STAMP)
	$(BIN)/python benchmarks/bench_emulator.py

bench-build: $(STAMP)
	$(BIN)/python benchmarks/bench_build.py

# Traffic of every dispatched kernel, counted on the emulator, with an H200 model estimate;
# compared with KERNELS_BASELINE (the kernels before issue 13) when that file exists.
KERNELS_BASELINE ?= benchmarks/results/bench_kernels_before.json
bench-kernels: $(STAMP)
	$(BIN)/python benchmarks/bench_kernels.py $(if $(wildcard $(KERNELS_BASELINE)),--baseline $(KERNELS_BASELINE))

# The device checks (build, GPU tests, compute-sanitizer, kernel timings against torch.topk,
# ncu DRAM bytes). On the accelerator machine run it with its own python:
# `PYTHONPATH=. python3 scripts/gpu_check.py --results DIR`.
gpu-check: $(STAMP)
	$(BIN)/python scripts/gpu_check.py
