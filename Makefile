# Two commands set everything up on a fresh machine: `make build` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    ?= out
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 300
FUZZ_SEED ?= 0

.PHONY: build build-legacy test test-quick test-cache install cpp pkgconfig bench bench-plan bench-emulator bench-build bench-diff bench-dispatch bench-kernels bench-hostile fuzz gpu-check clean

# The system packages make needs (Debian: python3-venv, g++, libssl-dev), each missing one named.
SETUP_CHECK = PYTHON=$(PYTHON) CXX="$(CXX)" sh scripts/check_setup.sh

$(STAMP): pyproject.toml
	@$(SETUP_CHECK) build
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The main job with the default policy: plan, then compile the bundle into $(OUT)/.
build: $(STAMP)
	@$(SETUP_CHECK) build
	$(BIN)/topkgen plan --format json > /dev/null
	$(BIN)/topkgen build --out $(OUT) -j $(JOBS)
	@echo
	@echo "topkgen is installed in $(VENV)/, not on your PATH. Run it as $(BIN)/topkgen,"
	@echo "or activate the environment first:  . $(BIN)/activate  then  topkgen --help"

# The old exact-N grid, for comparison (CI builds it too).
build-legacy: $(STAMP)
	$(BIN)/topkgen build --policy policies/legacy/exact_n_grid.yaml --out $(OUT)-legacy -j $(JOBS)

# The C++ loader (loaders/cpp): g++, nlohmann/json from the nlohmann-json wheel, OpenSSL's
# libcrypto (Debian: libssl-dev) for SHA-256, libdl for the CUDA driver. No CUDA toolkit.
CXX      ?= g++
CPP_BIN  := build/cpp/topkgen-cpp
CPP_SRC  := loaders/cpp/include/topkgen/loader.hpp loaders/cpp/include/topkgen/manifest_schema.hpp \
            loaders/cpp/src/topkgen_cpp.cpp
NLOHMANN  = $(shell $(BIN)/python -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('nlohmann_json').origin).parent / 'include')")

$(CPP_BIN): $(CPP_SRC) | $(STAMP)
	@$(SETUP_CHECK) cpp
	mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror -Iloaders/cpp/include -isystem $(NLOHMANN) \
		loaders/cpp/src/topkgen_cpp.cpp -o $@.tmp -lcrypto -ldl
	mv $@.tmp $@

cpp: $(CPP_BIN)

# pkg-config for the header (CMake users: add_subdirectory(loaders/cpp), target topkgen::loader):
#   PKG_CONFIG_PATH=build/pkgconfig pkg-config --cflags --libs topkgen-loader
PC_FILE := build/pkgconfig/topkgen-loader.pc
$(PC_FILE): pyproject.toml | $(STAMP)
	mkdir -p $(dir $@)
	printf '%s\n' 'Name: topkgen-loader' 'Description: topkgen bundle loader (header-only C++17)' \
		'Version: $(shell $(BIN)/python -c "import topkgen; print(topkgen.__version__)")' \
		'Cflags: -std=c++17 -I$(CURDIR)/loaders/cpp/include -isystem $(NLOHMANN)' 'Libs: -lcrypto -ldl' > $@.tmp
	mv $@.tmp $@

pkgconfig: $(PC_FILE)

# Tests share one compile cache per checkout so pytest-xdist workers reuse each other's work.
# What `make build` (and build-legacy) compiled seeds it first: `topkgen cache import` checks
# every cubin's sha256 and re-derives its key from the source this checkout renders, so a
# kernel of another source is not taken; the tests that check compiling use caches of their
# own, so nothing they check is skipped. Without a bundle (a fresh clone) it compiles all.
TEST_CACHE ?= $(CURDIR)/.cache
test-cache: $(STAMP)
	@for b in $(OUT) $(OUT)-legacy; do if [ -f $$b/manifest.json ]; then \
	TOPKGEN_CACHE_DIR=$(TEST_CACHE) TOPKGEN_CACHE_URL= $(BIN)/topkgen cache import $$b \
	|| echo "make: not seeded from $$b: its kernels are compiled again"; fi; done

test: $(STAMP) $(CPP_BIN) test-cache
	TOPKGEN_CACHE_DIR=$(TEST_CACHE) $(BIN)/python -m pytest -q -n $(JOBS)

# A few minutes: a file per stage (policy, build and the compile cache through the default
# bundle, manifest checks, the emulator, runtime, diff, cli, loaders, tools) and the layout checks.
QUICK_TESTS = tests/system/test_layout.py tests/policy/test_explain_grid.py tests/cli/test_first_use.py \
              tests/runtime/test_torch_edge_cases.py tests/runtime/test_emulator_first_use.py \
              tests/diff/test_diff_regions.py tests/loaders/test_cpp_first_use.py tests/tools/test_check_setup.py
test-quick: $(STAMP) $(CPP_BIN) test-cache
	TOPKGEN_CACHE_DIR=$(TEST_CACHE) $(BIN)/python -m pytest -q $(QUICK_TESTS)

# Bounded-time fuzzing of the policy reader, the manifest reader and `run` (the time split
# between them); a failing or hanging input is left in fuzz-out/. FUZZ_SEED=N draws other
# inputs than CI's (hypothesis seeds N+1, N+2, ...).
fuzz: $(STAMP)
	TOPKGEN_CACHE_DIR=$(CURDIR)/.cache $(BIN)/python -m tests.support.fuzz --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED)

bench: bench-plan bench-diff bench-dispatch bench-emulator bench-build bench-kernels

bench-plan: $(STAMP)
	$(BIN)/python benchmarks/bench_cli.py plan

# diff HEAD~1 HEAD rendering both sides (target < 1 s), and with --build on a warm compile
# cache (target < 2 s; its warm-up runs fill the cache, TOPKGEN_CACHE_DIR or ~/.cache/topkgen).
bench-diff: $(STAMP)
	$(BIN)/python benchmarks/bench_cli.py diff diff-build

# One dispatch lookup (Python table, C++ loader) beside one select call.
bench-dispatch: $(STAMP) $(CPP_BIN)
	$(BIN)/python benchmarks/bench_dispatch.py

clean:
	rm -rf $(OUT) $(OUT)-legacy .cache build dist *.egg-info fuzz-out

# Every refusal of a hostile cache, bundle or workload (issue 33) timed, with its peak memory:
# each under 2 s and 2 GiB, or exit 1.
bench-hostile: $(STAMP) $(CPP_BIN)
	$(BIN)/python benchmarks/bench_hostile.py

bench-emulator: $(STAMP)
	$(BIN)/python benchmarks/bench_emulator.py

bench-build: $(STAMP)
	$(BIN)/python benchmarks/bench_build.py

# Traffic of every dispatched kernel, counted on the emulator, with an H200 model estimate;
# compared with KERNELS_BASELINE (the kernels before issue 13) when that file exists.
KERNELS_BASELINE ?= benchmarks/results/bench_kernels_before.json
# Writes benchmarks/results/bench_kernels.md (the tables) and bench_kernels.json (the rows).
bench-kernels: $(STAMP)
	$(BIN)/python benchmarks/bench_kernels.py --json benchmarks/results/bench_kernels.json \
		--md benchmarks/results/bench_kernels.md $(if $(wildcard $(KERNELS_BASELINE)),--baseline $(KERNELS_BASELINE))
	$(BIN)/python benchmarks/bench_every_k.py --json benchmarks/results/bench_every_k.json \
		--md benchmarks/results/bench_every_k.md

# The device checks (build, GPU tests, compute-sanitizer, kernel timings against torch.topk,
# ncu DRAM bytes). On the accelerator machine run it with its own python:
# `PYTHONPATH=. python3 scripts/gpu_check.py --results DIR`.
gpu-check: $(STAMP) $(CPP_BIN)
	$(BIN)/python scripts/gpu_check.py
