"""The webgpu backend on whole programs: zoo models all on webgpu against the reference, fusion, capture-replay
and its guards, placement around what it lacks, no adapter, device loss."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("wgpu")

from webgpu_testkit import export_small, small_inputs

import edgerun
from edgerun.errors import BackendUnavailableError, EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program
from edgerun.runtime.loader import prepare_graph

try:
    from edgerun.backends.webgpu import WebGpuBackend, get_device
    from edgerun.backends.webgpu.device import DeviceLostError, GpuDevice, _request_adapter
    from edgerun.backends.webgpu.runner import PartitionRunner

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)

FAST_MODELS = ("mlp", "din")
ALL_MODELS = ("mlp", "din", "squeezenet1_1", "mobilenet_v2", "shufflenet_v2", "resnet18", "resnet50",
              "minilm_l6", "llama_small", "vit_tiny")


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("webgpu_zoo"))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    w = want.astype(np.float64)
    return float(np.abs(got.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))


def check_model_on_webgpu(name: str, zoo_dir: str) -> None:
    from edgerun.zoo import get

    program, feeds = export_small(name, zoo_dir)
    want = edgerun.load(program).run(feeds)
    loaded = edgerun.load(program, ["webgpu"])
    placed = {p.backend for p in loaded.parts.partitions}
    assert placed == {"webgpu"}, f"{name}: some nodes left webgpu: {placed}"
    got = loaded.run(feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert rel_err(g, w) <= get(name).tolerance, (name, rel_err(g, w))


@pytest.mark.parametrize("name", FAST_MODELS)
def test_small_zoo_models_all_on_webgpu(name: str, zoo_dir: str) -> None:
    check_model_on_webgpu(name, zoo_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in ALL_MODELS if m not in FAST_MODELS])
def test_every_zoo_model_all_on_webgpu(name: str, zoo_dir: str) -> None:
    check_model_on_webgpu(name, zoo_dir)


# Half precision: stored as f16, computed in f32 and rounded once at the end of each fused chain, against the
# reference's float16 kernels (numpy in half): max |error| / max |output| within 4e-3 (about 4 half-precision
# steps; measured 5e-4 to 1.6e-3 across the zoo, MiniLM the largest), where float32 holds the zoo's 1e-4.
F16_TOLERANCE = 4e-3


def check_model_in_float16_on_webgpu(name: str) -> None:
    import torch

    from edgerun.frontends.torch import export
    from edgerun.zoo import get

    if not get_device().has_f16:
        pytest.skip("this adapter has no shader-f16 (float16 nodes are then not claimed)")
    inputs = tuple(t.half() if t.is_floating_point() else t for t in small_inputs(name))
    program = export(get(name).build().to(torch.float16), inputs, name=f"{name}_f16")
    assert any(spec.dtype is DType.float16 for spec in program.graph.specs.values())
    feeds = [t.numpy() for t in inputs]
    want = edgerun.load(program).run(feeds)
    loaded = edgerun.load(program, ["webgpu"])
    placed = {p.backend for p in loaded.parts.partitions}
    assert placed == {"webgpu"}, f"{name} in float16: some nodes left webgpu: {placed}"
    for g, w in zip(loaded.run(feeds), want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert rel_err(g, w) <= F16_TOLERANCE, (name, rel_err(g, w))


@pytest.mark.parametrize("name", FAST_MODELS)
def test_small_zoo_models_in_float16_all_on_webgpu(name: str) -> None:
    check_model_in_float16_on_webgpu(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in ALL_MODELS if m not in FAST_MODELS])
def test_every_zoo_model_in_float16_all_on_webgpu(name: str) -> None:
    check_model_in_float16_on_webgpu(name)


def mlp_partition(zoo_dir: str, fuse: bool = True, replay: bool = True) -> tuple[PartitionRunner, Graph, list[np.ndarray]]:
    program, feeds = export_small("mlp", zoo_dir)
    graph = prepare_graph(program.graph)
    cp = WebGpuBackend(fuse=fuse, replay=replay).compile(graph)
    runner = cp.info["runner"]
    assert isinstance(runner, PartitionRunner)
    return runner, graph, feeds


def call(runner: PartitionRunner, graph: Graph, feeds: list[np.ndarray]) -> list[np.ndarray]:
    outs = [np.empty(graph.specs[o].shape, graph.specs[o].dtype.np) for o in graph.outputs]
    runner.run(feeds, outs)
    return outs


def test_fusion_claims_matmul_bias_activation_and_chains(zoo_dir: str) -> None:
    fused, graph, feeds = mlp_partition(zoo_dir, fuse=True)
    plain, _, _ = mlp_partition(zoo_dir, fuse=False)
    assert len(plain.kernels) == len(graph.nodes)  # one dispatch per node (no raster fills here)
    assert len(fused.kernels) < len(plain.kernels)
    labels = [k.label for k in fused.kernels]
    assert "matmul+add+maximum" in labels  # linear + ReLU: one dispatch
    assert any(label.count("+") >= 3 and "erf" in label for label in labels)  # GELU's chain: one dispatch
    a, b = call(fused, graph, feeds)[0], call(plain, graph, feeds)[0]
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_one_command_encoder_and_one_submit_per_call_over_an_arena_plan(zoo_dir: str) -> None:
    # The partition's values live in one device buffer planned over the dispatch order: values alive at the
    # same dispatch never share bytes, values that are not do (the arena is smaller than their sum), and every
    # bound range is aligned and inside it. A call, fresh or replayed, is one command encoder and one submit.
    runner, graph, feeds = mlp_partition(zoo_dir, fuse=False)
    life: dict[str, list[int]] = {v: [-1, -1] for v in graph.inputs}
    for i, k in enumerate(runner.kernels):
        for v in k.values:
            if v not in graph.constants:
                life.setdefault(v, [i, i])[1] = i
    for v in graph.outputs:
        life[v][1] = len(runner.kernels)
    ranges = {v: runner.value_range(v) for v in life}
    assert all(o % runner.align == 0 and o + n <= runner.arena_bytes for o, n in ranges.values())
    assert runner.arena_bytes < sum(n for _, n in ranges.values())
    names = sorted(life)
    for a_i, a in enumerate(names):
        for b in names[a_i + 1:]:
            (oa, na), (ob, nb) = ranges[a], ranges[b]
            alive_together = life[a][0] <= life[b][1] and life[b][0] <= life[a][1]
            assert not (alive_together and oa < ob + nb and ob < oa + na), (a, b)
    device = runner.gpu.device
    counts = {"encoders": 0, "submits": 0}
    encoder, submit = device.create_command_encoder, device.queue.submit

    def ours() -> bool:  # wgpu-py's map_async makes an encoder and submits of its own: count edgerun's only
        return str(sys._getframe(2).f_globals.get("__name__", "")).startswith("edgerun.")

    def counted_encoder(*args: Any, **kwargs: Any) -> Any:
        counts["encoders"] += ours()
        return encoder(*args, **kwargs)

    def counted_submit(*args: Any, **kwargs: Any) -> Any:
        counts["submits"] += ours()
        return submit(*args, **kwargs)
    device.create_command_encoder, device.queue.submit = counted_encoder, counted_submit
    try:
        for calls in range(1, 4):
            call(runner, graph, feeds)
            assert counts == {"encoders": calls, "submits": calls}
    finally:
        del device.create_command_encoder, device.queue.submit
    assert (runner.stats.fresh, runner.stats.replays) == (1, 2)


def test_replay_equals_fresh_encode_bit_for_bit_over_100_calls(zoo_dir: str) -> None:
    replayed, graph, feeds = mlp_partition(zoo_dir, replay=True)
    fresh, _, _ = mlp_partition(zoo_dir, replay=False)
    rng = np.random.default_rng(1)
    for step in range(100):
        x = (feeds[0] + rng.normal(0, 0.1, feeds[0].shape)).astype(np.float32)
        a, b = call(replayed, graph, [x])[0], call(fresh, graph, [x])[0]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), step
    assert replayed.stats.replays == 99 and replayed.stats.fresh == 1 and not replayed.stats.fallbacks
    assert fresh.stats.replays == 0 and fresh.stats.fresh == 100


def test_guard_inputs_new_shape_or_dtype_falls_back(zoo_dir: str) -> None:
    runner, graph, feeds = mlp_partition(zoo_dir)
    want = call(runner, graph, feeds)[0]
    got = call(runner, graph, [feeds[0].astype(np.float64)])[0]  # same values, another dtype: re-encoded
    assert runner.stats.fallbacks == {"inputs": 1}
    np.testing.assert_array_equal(got, want)
    with pytest.raises(EdgerunError, match="must have shape"):
        call(runner, graph, [feeds[0][..., :-1]])
    assert runner.stats.fallbacks == {"inputs": 2}
    call(runner, graph, [feeds[0].astype(np.float64)])
    assert runner.stats.replays == 1  # the captured (float64) call still replays


def test_guard_plan_rebuilt_falls_back(zoo_dir: str) -> None:
    runner, graph, feeds = mlp_partition(zoo_dir)
    want = call(runner, graph, feeds)[0]
    runner.set_fusion(False)
    got = call(runner, graph, feeds)[0]
    assert runner.stats.fallbacks == {"plan": 1} and runner.stats.replays == 0
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_guard_buffers_reallocated_falls_back_and_stale_replay_would_be_wrong(zoo_dir: str) -> None:
    runner, graph, feeds = mlp_partition(zoo_dir)
    before = call(runner, graph, feeds)[0]
    stale = runner._captured
    assert stale is not None
    weight = max(graph.constants, key=lambda k: graph.constants[k].size)
    new = {weight: (graph.constants[weight] * 0.5).astype(np.float32)}
    runner.update_constants(new)
    after = call(runner, graph, feeds)[0]
    assert runner.stats.fallbacks == {"buffers": 1}
    changed = graph.copy()
    changed.constants[weight] = new[weight]
    np.testing.assert_allclose(after, edgerun.load(changed).run(feeds)[0], rtol=1e-5, atol=1e-6)
    outs = [np.empty_like(after)]
    runner._submit(stale.dispatches, feeds, outs)  # what replaying the stale capture would have computed
    np.testing.assert_allclose(outs[0], before, rtol=1e-6)
    assert not np.allclose(outs[0], after)


def two_method_program() -> Program:
    """forward: acc' = acc + 2x, returns acc' + 0.5; peek: (acc + y) * 2. One state, two methods."""
    spec = TensorSpec((2, 3), DType.float32)
    methods = {}
    for name in ("forward", "peek"):
        g = Graph()
        b = Builder(g)
        x = g.add_input("x" if name == "forward" else "y", spec)
        g.specs["acc"] = spec
        g.state_inputs.append("acc")
        w = g.add_constant(np.full((2, 3), 2, np.float32), name="w")
        if name == "forward":
            new = b.binary("add", "acc", b.binary("mul", x, w))
            g.outputs = [b.binary("add", new, b.const(np.float32(0.5)))]
            g.state_updates["acc"] = new
        else:
            g.outputs = [b.binary("mul", b.binary("add", "acc", x), w)]
        methods[name] = g
    return Program.from_methods(methods, state={"acc": np.zeros((2, 3), np.float32)})


def method_runner(model: Any, name: str) -> PartitionRunner:
    (compiled,) = model.method(name).parts.compiled
    assert compiled.backend == "webgpu"
    return compiled.info["runner"]


def test_guard_method_each_method_replays_only_its_own_capture() -> None:
    # Switching methods: the other method's first call is a fresh encode of its own dispatches (its own
    # partition and capture), never a replay of the method called before; later calls of each replay their
    # own. The state both read changes between calls and every output follows it.
    model = edgerun.load(two_method_program(), ["webgpu"])
    forward, peek = method_runner(model, "forward"), method_runner(model, "peek")
    x, ones = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    for calls in range(1, 4):
        np.testing.assert_allclose(model(x), 2 * calls * x + 0.5)
        np.testing.assert_allclose(model.peek(ones), (2 * calls * x + 1) * 2)
        assert (forward.stats.fresh, forward.stats.replays) == (1, calls - 1)
        assert (peek.stats.fresh, peek.stats.replays) == (1, calls - 1)
    assert not forward.stats.fallbacks and not peek.stats.fallbacks


def test_guard_state_layout_changed_falls_back() -> None:
    # What the device keeps across calls (held inputs, kept states, their ranges) is part of the capture:
    # holding another set re-encodes; re-planning to the same layout is the `buffers` guard's. The state
    # `acc` is kept on the device from the start (keep_state), and survives every re-plan.
    model = edgerun.load(two_method_program(), ["webgpu"])
    forward = method_runner(model, "forward")
    assert list(forward.resident) == ["acc"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    model(x)
    model(x)
    assert forward.stats.replays == 1
    forward.hold(["x"])
    np.testing.assert_allclose(model(x), 6 * x + 0.5)
    assert forward.stats.fallbacks == {"state": 1}
    forward.hold(["x"], align=4096)
    assert forward.value_range("x")[0] % 4096 == 0
    np.testing.assert_allclose(model(x), 8 * x + 0.5)
    assert forward.stats.fallbacks == {"state": 2}
    forward.hold(["x"], align=4096)  # the same layout again: new buffers, not a new state layout
    np.testing.assert_allclose(model(x), 10 * x + 0.5)
    assert forward.stats.fallbacks == {"state": 2, "buffers": 1}
    np.testing.assert_allclose(model(x), 12 * x + 0.5)
    assert forward.stats.replays == 2


def test_state_stays_on_the_device_and_comes_back_when_the_host_needs_it() -> None:
    # forward reads and updates `acc` alone, so its partition keeps it (Backend keep_state): calls move only
    # x and the output, the store's buffer is stale until something on the host reads it (model.state, the
    # peek method, which reads acc on the host), and set_state / reset_state reach the device.
    model = edgerun.load(two_method_program(), ["webgpu"])
    store = model.method("forward").parts.state.store
    assert model.method("forward").parts.state.resident == ("acc",)
    assert model.method("peek").parts.state.resident == ()  # read only: stays on the host
    x, ones = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    for calls in range(1, 4):
        np.testing.assert_allclose(model(x), 2 * calls * x + 0.5)
    np.testing.assert_array_equal(store.buffers["acc"], 0)  # never read back: the device holds the value
    np.testing.assert_allclose(model.state["acc"], 6 * x)
    np.testing.assert_allclose(model(x), 8 * x + 0.5)  # the host's copy was current: uploaded again
    np.testing.assert_allclose(model.peek(ones), (8 * x + 1) * 2)  # pulled before peek's call
    model.set_state(acc=np.full((2, 3), 1, np.float32))
    np.testing.assert_allclose(model(x), 2 * x + 1.5)
    model.reset_state()
    np.testing.assert_allclose(model(x), 2 * x + 0.5)
    snap = model.method("forward").parts.state.store.snapshot()
    np.testing.assert_allclose(snap["acc"], 2 * x)
    # Without keep_state the state crosses every call, with the same outputs.
    plain = edgerun.load(two_method_program(), [WebGpuBackend(keep_state=False)])
    assert plain.method("forward").parts.state.resident == ()
    for calls in range(1, 3):
        np.testing.assert_allclose(plain(x), 2 * calls * x + 0.5)
    np.testing.assert_allclose(plain.method("forward").parts.state.store.buffers["acc"], 4 * x)


def test_op_the_backend_lacks_is_placed_elsewhere() -> None:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 8), DType.float32))
    y = b.emit("exp", [x])
    small = b.emit("cast", [y], dtype="int8")  # int8: not claimed
    h2 = b.emit("add", [small, small])
    back = b.emit("cast", [h2], dtype="float32")
    g.outputs = [b.emit("tanh", [back])]
    loaded = edgerun.load(g, ["webgpu"])
    placed = [p.backend for p in loaded.parts.partitions]
    assert placed == ["webgpu", "reference", "webgpu"]
    feed = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_allclose(loaded.run([feed])[0], edgerun.load(g).run([feed])[0], rtol=1e-6)


def test_no_adapter_names_the_packages_to_install() -> None:
    env = {**os.environ, "VK_ICD_FILENAMES": "/nonexistent.json", "VK_DRIVER_FILES": "/nonexistent.json",
           "WGPU_BACKEND_TYPE": "Vulkan"}
    code = ("import edgerun\nfrom edgerun.errors import BackendUnavailableError\n"
            "try:\n    edgerun.load(edgerun.ir.graph.Graph(), ['webgpu'])\n"
            "except BackendUnavailableError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "ERR backend 'webgpu' found no WebGPU adapter" in out.stdout, out.stdout + out.stderr
    assert "pip install wgpu" in out.stdout and "mesa-vulkan-drivers libvulkan1" in out.stdout


def test_device_loss_is_an_edgerun_error_not_a_hang(zoo_dir: str) -> None:
    program, feeds = export_small("mlp", zoo_dir)
    graph = prepare_graph(program.graph)
    gpu = GpuDevice(_request_adapter())
    runner = PartitionRunner(gpu, graph)
    call(runner, graph, feeds)
    gpu.device.destroy()  # wgpu's own device loss: the next command is refused, and we say so
    start = time.perf_counter()
    with pytest.raises(DeviceLostError, match="was lost while running"):
        call(runner, graph, feeds)
    assert time.perf_counter() - start < 5
    assert gpu.lost
    with pytest.raises(DeviceLostError, match="load the program again"):
        call(runner, graph, feeds)
    assert issubclass(DeviceLostError, EdgerunError)
