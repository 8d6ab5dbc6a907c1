"""`edgerun generate`, `edgerun chat`, `edgerun llm export` and `edgerun llm serve` as real subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

import edgerun.llm


def _edgerun(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgerun", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})


def test_generate_prints_what_the_api_returns(tiny_chat_dir: Path, tiny_chat) -> None:
    out = _edgerun("generate", str(tiny_chat_dir), "--prompt", "Once upon a time", "-n", "6", "--context", "128")
    assert out.returncode == 0, out.stderr
    assert out.stdout == tiny_chat.generate("Once upon a time", max_new_tokens=6).text + "\n"
    assert "tokens/s" in out.stderr


def test_chat_is_multi_turn(tiny_chat_dir: Path, tiny_chat) -> None:
    out = _edgerun("chat", str(tiny_chat_dir), "-n", "4", "--context", "128", stdin="Hello\nAnd again\n\n")
    assert out.returncode == 0, out.stderr
    first = tiny_chat.chat([{"role": "user", "content": "Hello"}], max_new_tokens=4)
    second = tiny_chat.chat([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": first.text},
                             {"role": "user", "content": "And again"}], max_new_tokens=4)
    assert out.stdout.count("> ") == 3 and first.text in out.stdout and second.text in out.stdout
    assert out.stderr.count("tokens/s") == 2


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model")
    out = _edgerun("generate", str(bogus), "--prompt", "x")
    assert out.returncode == 1 and "not a GGUF file" in out.stderr and "Traceback" not in out.stderr


def test_export_writes_one_program_file_that_loads(tiny_chat_dir: Path, tiny_chat, tmp_path: Path) -> None:
    path = tmp_path / "model.edgerun"
    out = _edgerun("llm", "export", str(tiny_chat_dir), "-o", str(path), "--context", "128", "--chunk", "16")
    assert out.returncode == 0, out.stderr
    assert os.listdir(tmp_path) == ["model.edgerun"] and out.stdout == f"{path}\n"
    loaded = edgerun.llm.load(path)
    assert loaded.program.methods == ["prefill", "decode"]
    ids = tiny_chat.tokenizer.encode("The capital of France is")
    np.testing.assert_array_equal(loaded.next_logits(ids), tiny_chat.next_logits(ids))
    assert loaded.chat([{"role": "user", "content": "Hi"}], max_new_tokens=3).text == \
        tiny_chat.chat([{"role": "user", "content": "Hi"}], max_new_tokens=3).text


def test_serve_answers_on_its_port(tiny_chat_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "edgerun", "llm", "serve", str(tiny_chat_dir), "--port",
                             str(port), "--context", "128"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.time() < deadline, "server did not come up"
                time.sleep(0.5)
        assert models["data"][0]["id"] == tiny_chat_dir.name
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                           json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=60).json()
        assert reply["object"] == "text_completion" and reply["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        proc.wait(30)
