# The commands of the README: `make demo`, `make test-fast` and `make test`. Each sets up .venv first.
PY := .venv/bin/python
PYTEST_ARGS ?=
# The numpy-only tier (docs/testing.md): the areas whose tests need numpy and edgerun alone. --numpy-only
# (tests/numpy_only.py) skips any test there that imports torch, onnx, onnxruntime, transformers, ...
FAST_TESTS := tests/ir tests/passes tests/program tests/runtime tests/search tests/quant tests/accel \
              tests/devtools tests/test_layering.py tests/test_assertions.py tests/test_benchmarks_page.py

.PHONY: setup demo test test-fast lint docs bench

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m edgerun.demo

lint: setup
	.venv/bin/ruff check edgerun tests bench fuzz
	.venv/bin/mypy edgerun

# The API reference (docs/api/, Sphinx autodoc) with warnings as errors: a broken reference fails `make test`.
docs: setup
	$(PY) -m sphinx -q -W --keep-going -b html docs/api build/api

test: lint docs
	$(PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -n 2 --numpy-only -m "not slow and not chromium and not postgres" $(FAST_TESTS) $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run_all.py
