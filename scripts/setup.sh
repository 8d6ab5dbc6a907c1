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

stamp=.venv/.installed
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
# Wheels that ship real ONNX models used by tests/onnx; --no-deps: only their .onnx files are read.
install_model_wheels() {
  for wheel in rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3; do
    .venv/bin/pip show -q "${wheel%%==*}" >/dev/null 2>&1 ||
      .venv/bin/pip install -q --disable-pip-version-check --no-deps "$wheel"
  done
}
if [[ -f $stamp && "$(cat $stamp)" == "$want" ]]; then
  install_model_wheels
  exit 0
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
install_model_wheels
echo "$want" > $stamp
