"""`edgerun llm serve` with its guard options, as a real subprocess: an API key file, an alias, and a clear
one-line error for a key file with no key."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_serve_with_a_key_file_and_an_alias(tiny_chat_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-cli-key\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "edgerun", "llm", "serve", str(tiny_chat_dir), "--port",
                             str(port), "--context", "128", "--api-key-file", str(keys), "--alias", "tiny",
                             "--max-tokens-limit", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                health = httpx.get(f"{url}/health", timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.time() < deadline, "server did not come up"
                time.sleep(0.5)
        assert health.json() == {"status": "ok"}
        assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401
        auth = {"Authorization": "Bearer sk-cli-key"}
        reply = httpx.post(f"{url}/v1/completions", headers=auth, timeout=60,
                           json={"model": "tiny", "prompt": "Hi", "max_tokens": 3, "temperature": 0}).json()
        assert reply["usage"]["completion_tokens"] == 3
        refused = httpx.post(f"{url}/v1/completions", headers=auth, timeout=60,
                             json={"model": "tiny", "prompt": "Hi", "max_tokens": 9})
        assert refused.status_code == 400 and "between 1 and 8" in refused.json()["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_key_file_without_a_key_is_a_clear_error(tiny_chat_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# no key yet\n\n")
    proc = subprocess.run([sys.executable, "-m", "edgerun", "llm", "serve", str(tiny_chat_dir), "--api-key-file",
                           str(keys)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith("holds no key") and "Traceback" not in proc.stderr


def test_an_embedding_program_without_its_tokenizer_is_a_clear_error(tiny_chat_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "edgerun", "llm", "serve", str(tiny_chat_dir),
                           "--embedding-program", "minilm.edgerun"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("--embedding-program and --embedding-tokenizer go together")


def test_a_batch_size_out_of_range_is_a_clear_error(tiny_chat_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "edgerun", "llm", "serve", str(tiny_chat_dir), "--batch-size", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("--batch-size must be 1 to 64 and --kv-cache-mb >= 1, got 0 and 1024")
