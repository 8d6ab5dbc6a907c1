#!/usr/bin/env bash
# Bench-only set-up for bench/llm.py's llama.cpp peer: a separate venv, .venv-bench-llm, holding
# llama-cpp-python built from its source distribution with -DGGML_NATIVE=ON (the wheel on PyPI is a generic
# build; the issue asks for llama.cpp at its best on this CPU). Not part of `make test`: edgerun never imports
# llama_cpp, and bench/llm.py runs the peer in its own process with this venv's python.
# The build compiles llama.cpp and takes 10-16 minutes on 2 idle cores; it runs under `nice -n 19`.
# Idempotent: nothing is done when the venv already imports llama_cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BENCH_LLM_VENV:-.venv-bench-llm}
# The same interpreter as the project's venv (its base, not the venv itself, so no package leaks across).
PY=${BENCH_LLM_PYTHON:-$(.venv/bin/python -c 'import sys; print(sys._base_executable)' 2>/dev/null || command -v python3)}
if [[ -x $VENV/bin/python ]] && $VENV/bin/python -c 'import llama_cpp' 2>/dev/null; then
  exit 0
fi
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  nice -n 19 "$VENV/bin/pip" install --disable-pip-version-check --no-binary llama-cpp-python \
  "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
$VENV/bin/python -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__)'
