# moepack: `make demo` runs the whole toolkit on the shipped model; `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
C_SOURCES := $(wildcard runtime/src/*.c runtime/src/*.h runtime/include/*.h convert/native/*.[ch])

.PHONY: all install test test-slow test-asan test-packaging lint demo bench bench-quant \
	bench-convert bench-verify bench-torrent bench-runtime bench-quality bench-kernels bench-serve \
	chromium fuzz asan clean

all: install

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build. TORCH_INDEX: the
# index to take it from (PyPI's Linux torch is the CUDA build; the CPU one is
# https://download.pytorch.org/whl/cpu); empty: pip's configured indexes.
$(VENV)/.deps: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install --quiet "setuptools>=77" wheel
	$(PIP) install --quiet -e '.[test]' --no-build-isolation
	touch $@

$(STAMP): $(VENV)/.deps setup.py moepack/__init__.py $(C_SOURCES)
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	touch $@

install: $(STAMP)

test: install
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider

test-slow: install
	$(PY) -m pytest -q -m slow -p no:cacheprovider

# CI: the C tests, then the whole forward pass (every model*.c, kernels*.c, sample.c) on a
# converted tiny model of every architecture the engine runs, all built with AddressSanitizer +
# UBSan (the forward-pass part, 14 architectures: 76 s on the shared 2-core VM, 2026-12-01,
# commit 7709553, about 60 s of it compiling).
test-asan: install
	$(MAKE) -C runtime asan
	$(PY) -m pytest -q -p no:cacheprovider tests/test_runtime_engine_asan.py

# CI: a wheel built from this tree, installed with its base dependencies (from the package
# index) into a fresh venv without torch, runs convert/verify/run on the demo (~1 min).
test-packaging: install
	$(PY) -m pytest -q -p no:cacheprovider tests/test_packaging.py

lint: install
	$(VENV)/bin/ruff check .

demo: install
	$(PY) -m demo.run_demo

# llama-cpp-python builds from source without build isolation: its backend must be in the venv.
$(VENV)/.bench-deps: pyproject.toml | $(STAMP)
	$(PIP) install --quiet "scikit-build-core>=0.9"
	$(PIP) install --quiet -e '.[bench]' --no-build-isolation
	touch $@

bench: install $(VENV)/.bench-deps
	$(PY) -m bench.run_all

bench-quant: install
	$(PY) -m bench.quant

bench-convert: install
	nice $(PY) -m bench.convert

bench-verify: install
	nice $(PY) -m bench.verify

bench-torrent: install
	nice $(PY) -m bench.torrent

bench-runtime: install
	nice $(PY) -m bench.runtime

bench-quality: install $(VENV)/.bench-deps
	nice $(PY) -m bench.quality --matrix --reference demo/model --text demo/heldout.txt

# llama.cpp's ggml is built once from the llama-cpp-python sdist under build/ggml (a few minutes).
bench-kernels: | $(VENV)/bin/python
	$(PY) -m bench.kernels

# `moepack serve` against `moepack run` on the demo model; numbers go to BENCHMARKS.md by hand.
bench-serve: install
	nice $(PY) -m bench.serve

# Headless Chromium for tests/test_serve_page.py (Debian's package; the test installs it too
# when it runs as root and finds none).
chromium:
	command -v chromium >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

fuzz: install
	MOEPACK_FUZZ_EXAMPLES=20000 $(PY) -m pytest -q tests/test_fuzz*.py -p no:cacheprovider

asan:
	$(MAKE) -C runtime asan

clean:
	rm -rf build $(VENV) runtime/_engine*.so convert/_encoder*.so *.egg-info
