# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test lint bench

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m edgerun.demo

lint: setup
	.venv/bin/ruff check edgerun tests bench
	.venv/bin/mypy edgerun

test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

bench: setup
	$(PY) bench/run_all.py
