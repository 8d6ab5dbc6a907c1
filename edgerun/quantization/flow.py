"""`quantize(program, scheme=..., calibration=...) -> Program`: the schemes, their checks, and the per-layer report."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret
from edgerun.passes.dead_code_pass import DeadCodePass
from edgerun.passes.pipeline import optimize
from edgerun.program import Program
from edgerun.quantization.observers import OBSERVERS, uint8_params
from edgerun.quantization.rewrite import (
    Layer,
    find_embeddings,
    find_layers,
    folded_output,
    requantizable,
    rewrite_int4,
    rewrite_int8_dynamic,
    rewrite_int8_embeddings,
    rewrite_int8_static,
    uint8_glue,
)

# scheme -> (layer ops it quantizes, needs calibration, what it is)
SCHEMES: dict[str, tuple[tuple[str, ...], bool, str]] = {
    "int8-static": (("conv2d", "matmul"), True,
                    "int8 per-channel weights, uint8 per-tensor activations calibrated on your inputs; "
                    "int8 embedding tables"),
    "int8-dynamic": (("conv2d", "matmul"), False,
                     "int8 per-channel weights, uint8 activations quantized per call (ONNX Runtime's "
                     "quantize_dynamic); int8 embedding tables"),
    "int4-weight": (("matmul",), False,
                    "group-wise asymmetric int4 weights of linear layers, float activations; int8 embedding tables"),
    "8da4w": (("matmul",), False, "ExecuTorch's 8-bit dynamic per-token activations with symmetric group-wise "
              "int4 weights; int8 embedding tables"),
}
GROUP_SIZES = (32, 64, 128)
METADATA_KEY = "quantization"


@dataclass(frozen=True)
class LayerReport:
    name: str
    op: str
    sqnr_db: float  # of this layer's output, quantized graph against float, over the calibration data


@dataclass
class QuantizeReport:
    scheme: str
    layers: list[LayerReport] = field(default_factory=list)  # measured: only with calibration data
    skipped: list[str] = field(default_factory=list)  # excluded layers
    quantized: list[str] = field(default_factory=list)  # every quantized layer and embedding table, measured or not

    def table(self) -> str:
        head = f"scheme {self.scheme}: {len(self.quantized)} layers quantized, {len(self.skipped)} excluded"
        if not self.layers:
            return head + " (no per-layer SQNR without calibration data)" if self.quantized else head
        lines = [head, f"{'layer':40s} {'op':8s} {'SQNR dB':>8s}"]
        lines += [f"{r.name[:40]:40s} {r.op:8s} {r.sqnr_db:8.1f}" for r in self.layers]
        return "\n".join(lines)


def load_calibration(calibration: Mapping[str, np.ndarray] | str | os.PathLike[str], graph: Graph
                     ) -> list[dict[str, np.ndarray]]:
    """Calibration samples from a mapping or .npz: one array per program input, a leading sample axis optional.

    EdgerunError naming the array when the names, shapes or dtypes do not match the program's inputs.
    """
    if isinstance(calibration, (str, os.PathLike)):
        try:
            with np.load(calibration) as data:
                arrays = {k: np.asarray(data[k]) for k in data.files}
        except (OSError, ValueError) as exc:
            raise EdgerunError(f"cannot read calibration file {os.fspath(calibration)!r}: {exc}") from None
    else:
        arrays = {k: np.asarray(v) for k, v in calibration.items()}
    extra, missing = sorted(set(arrays) - set(graph.inputs)), [n for n in graph.inputs if n not in arrays]
    if extra or missing:
        raise EdgerunError(f"calibration arrays {sorted(arrays)} do not match the program's inputs {graph.inputs}"
                           + (f": no input named {extra}" if extra else "") + (f": missing {missing}" if missing else ""))
    counts = set()
    for name in graph.inputs:
        spec, arr = graph.specs[name], arrays[name]
        if arr.shape == spec.shape:
            arrays[name] = arr = arr[None]
        if arr.shape[1:] != spec.shape:
            raise EdgerunError(f"calibration array {name!r} has shape {arr.shape}; input {name!r} needs "
                               f"{spec.shape} or (samples, {', '.join(map(str, spec.shape))})")
        if not np.can_cast(arr.dtype, spec.dtype.np, casting="same_kind"):
            raise EdgerunError(f"calibration array {name!r} is {arr.dtype}; input {name!r} is {spec.dtype.value}")
        counts.add(arr.shape[0])
    if len(counts) != 1:
        raise EdgerunError(f"calibration arrays hold different numbers of samples: {sorted(counts)}")
    n = counts.pop()
    return [{k: arrays[k][i].astype(graph.specs[k].dtype.np) for k in graph.inputs} for i in range(n)]


def _layer_names(layer: Layer) -> set[str]:
    node = layer.node
    return {node.name, layer.output, *node.meta.values()}


def _check_exclude(candidates: list[Layer], graph: Graph, exclude: Sequence[str]) -> None:
    """EdgerunError naming each excluded name that is neither a quantizable layer's name nor an op type."""
    known_ops = {n.op for n in graph.nodes}
    names = set().union(*(_layer_names(layer) for layer in candidates)) if candidates else set()
    unknown = [e for e in exclude if e not in names and e not in known_ops]
    if unknown:
        raise EdgerunError(f"--exclude {unknown}: no layer or op type of that name in the program "
                           f"(layers are named by their output value, e.g. {sorted(c.output for c in candidates)[:3]})")


def _select(layers: list[Layer], exclude: Sequence[str]) -> tuple[list[Layer], list[str]]:
    kept, skipped = [], []
    for layer in layers:
        if layer.node.op in exclude or _layer_names(layer) & set(exclude):
            skipped.append(layer.output)
        else:
            kept.append(layer)
    return kept, skipped


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(max(signal, 1e-30) / noise)


def layer_report(float_graph: Graph, quant_graph: Graph, layers: list[Layer], scheme: str,
                 samples: list[dict[str, np.ndarray]], outputs: Mapping[str, str] | None = None,
                 uint8_results: Mapping[str, tuple[str, np.ndarray, np.ndarray]] | None = None) -> QuantizeReport:
    """SQNR of each quantized layer's output against float, both graphs run on the same samples.

    `outputs`: layer output -> the value reported instead (a folded ReLU's output, see rewrite.folded_output);
    `uint8_results`: such a value -> (the uint8 value standing for it in `quant_graph`, scale, zero point).
    """
    named = {layer.output: (outputs or {}).get(layer.output, layer.output) for layer in layers}
    wanted = set(named.values())
    as_uint8 = {q: (name, scale, zp) for name, (q, scale, zp) in (uint8_results or {}).items() if name in wanted}

    def collect(graph: Graph, dequantize: Mapping[str, tuple[str, np.ndarray, np.ndarray]]) -> dict[str, list[np.ndarray]]:
        seen: dict[str, list[np.ndarray]] = {w: [] for w in wanted}
        via_uint8 = {name for name, _, _ in dequantize.values()}  # read once, from the uint8 value

        def hook(node: Any, args: list[np.ndarray], outs: list[np.ndarray]) -> None:
            for name, value in zip(node.outputs, outs):
                if name in dequantize:
                    name, scale, zp = dequantize[name]
                    value = (value.astype(np.float32) - zp.astype(np.float32)) * scale
                    seen[name].append(value)
                elif name in seen and name not in via_uint8:
                    seen[name].append(value.copy())
        for sample in samples:
            interpret(graph, sample, hook=hook)
        return seen

    ref, got = collect(float_graph, {}), collect(quant_graph, as_uint8)
    report = QuantizeReport(scheme)
    for layer in layers:
        name = named[layer.output]
        if ref[name] and got[name]:
            r = np.concatenate([a.ravel() for a in ref[name]])
            g = np.concatenate([a.ravel() for a in got[name]])
            report.layers.append(LayerReport(name, layer.node.op, _sqnr(r, g)))
    return report


Calibration = Mapping[str, np.ndarray] | str | os.PathLike[str]


def calibrate_activations(graph: Graph, values: Sequence[str], samples: list[dict[str, np.ndarray]],
                          observer: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """uint8 (scale, zero point) of each named value (layer inputs and requantized outputs), observed over the samples."""
    observers = {name: OBSERVERS[observer]() for name in values}

    def observe(node: Any, args: list[np.ndarray], outs: list[np.ndarray]) -> None:
        for name, value in zip(node.outputs, outs):
            if name in observers:
                observers[name].observe(value)
    for sample in samples:
        for name in graph.inputs:  # a layer reading a graph input directly
            if name in observers:
                observers[name].observe(sample[name])
        interpret(graph, sample, hook=observe)
    return {name: uint8_params(*obs.range()) for name, obs in observers.items()}


def quantize(program: Program, scheme: str = "int8-dynamic", calibration: Calibration | None = None,
             exclude: Sequence[str] = (), group_size: int = 32, observer: str = "minmax",
             reduce_range: bool = False, static_linear: bool = False) -> Program:
    """A quantized copy of `program` (see docs/quantization.md).

    `calibration`: a mapping or .npz of one array per program input (leading sample axis optional); needed
    by int8-static, optional otherwise. `exclude`: layer names (output value, node name, or source module /
    ONNX node) or op types to keep in float. `reduce_range`: 7-bit int8 weights, which ONNX Runtime's
    uint8 x int8 kernels need to be exact on AVX2 machines (a little accuracy for the delegate).
    `static_linear`: int8-static calibrates linear layers' activations too and requantizes their results to
    uint8 as it does convs' (QLinearMatMul's form; by default they are quantized per call, as int8-dynamic
    does: see docs/quantization.md). With
    calibration data the per-layer SQNR report is stored in `metadata["quantization"]["layers"]`;
    `quantize_with_report` also returns it.
    """
    return quantize_with_report(program, scheme, calibration, exclude, group_size, observer,
                                reduce_range=reduce_range, static_linear=static_linear)[0]


def quantize_with_report(program: Program, scheme: str = "int8-dynamic", calibration: Calibration | None = None,
                         exclude: Sequence[str] = (), group_size: int = 32, observer: str = "minmax",
                         report_samples: int = 8, reduce_range: bool = False,
                         static_linear: bool = False) -> tuple[Program, QuantizeReport]:
    """`quantize`, and the per-layer report (empty without calibration data)."""
    if scheme not in SCHEMES:
        raise EdgerunError(f"unknown quantization scheme {scheme!r}; known schemes: {', '.join(SCHEMES)}")
    needs_calibration = SCHEMES[scheme][1]
    if scheme in ("int4-weight", "8da4w") and group_size not in GROUP_SIZES:
        raise EdgerunError(f"int4 group size must be one of {GROUP_SIZES}, got {group_size}")
    if observer not in OBSERVERS:
        raise EdgerunError(f"unknown observer {observer!r}; known observers: {', '.join(OBSERVERS)}")
    if program.state or len(program.methods) > 1:
        from edgerun.quantization.methods import quantize_methods  # each method on its functional form

        graphs, result = quantize_methods(program, scheme, calibration, exclude, group_size, reduce_range)
        metadata = dict(program.metadata)
        metadata[METADATA_KEY] = _metadata(scheme, result, observer, reduce_range, group_size, {})
        return Program.from_methods(graphs, default_method=program.default_method, state=program.state,
                                    metadata=metadata), result
    float_graph, _ = optimize(program.graph)
    samples = load_calibration(calibration, float_graph) if calibration is not None else []
    if needs_calibration and not samples:
        raise EdgerunError(f"scheme {scheme!r} needs calibration data (calibration= or --calibration data.npz)")
    graph, result, uint8_results = quantize_graph(float_graph, scheme, samples, exclude, group_size, observer,
                                                  report_samples, reduce_range, static_linear=static_linear)
    metadata = dict(program.metadata)
    metadata[METADATA_KEY] = _metadata(scheme, result, observer, reduce_range, group_size, uint8_results)
    return Program(graph=graph, metadata=metadata), result


def quantize_graph(float_graph: Graph, scheme: str, samples: list[dict[str, np.ndarray]], exclude: Sequence[str],
                   group_size: int, observer: str, report_samples: int, reduce_range: bool, *,
                   check_exclude: bool = True, static_linear: bool = False) -> tuple[Graph, QuantizeReport, dict[str, tuple[str, np.ndarray,
                                                                                                np.ndarray]]]:
    """The quantized copy of one optimised graph, its report, and the uint8 values standing for float ones.
    `check_exclude=False` lets a name in `exclude` name nothing here (another method's layer)."""
    ops = SCHEMES[scheme][0]
    candidates = find_layers(float_graph, ops)
    tables = find_embeddings(float_graph)
    if check_exclude:
        _check_exclude(candidates + tables, float_graph, exclude)
    layers, skipped = _select(candidates, exclude)
    embeddings, skipped_tables = _select(tables, exclude)
    skipped += skipped_tables
    graph = float_graph.copy()
    outputs: dict[str, str] = {}
    uint8_results: dict[str, tuple[str, np.ndarray, np.ndarray]] = {}
    if scheme == "int8-static":
        # Linear layers end in float (no requantized result) and read their activation quantized per call
        # unless static_linear: see docs/quantization.md, "Linear layers' activations".
        static = [layer for layer in layers if static_linear or layer.node.op != "matmul"]
        dynamic = [layer for layer in layers if not static_linear and layer.node.op == "matmul"]
        outputs = {layer.output: folded_output(float_graph, layer) for layer in static
                   if requantizable(float_graph, layer)}
        glue = uint8_glue(float_graph, set(outputs.values()))
        pools = [n for n in float_graph.nodes if n.op == "max_pool2d" and n.outputs[0] in glue]
        pooled = {pool.outputs[0] for pool in pools}
        observed = list(dict.fromkeys([*(layer.activation for layer in static), *outputs.values(),
                                       *(out for out in glue.values() if out not in pooled)]))
        params = calibrate_activations(float_graph, observed, samples, observer)
        for pool in pools:  # in graph order: a max pool between integer layers keeps its input's range
            params[pool.outputs[0]] = params[pool.inputs[0]]
        graph = rewrite_int8_static(graph, static, params, outputs, qmax=63 if reduce_range else 127,
                                    uint8_results=uint8_results, glue=glue)
        graph = rewrite_int8_dynamic(graph, dynamic, qmax=63 if reduce_range else 127)
    elif scheme == "int8-dynamic":
        graph = rewrite_int8_dynamic(graph, layers, qmax=63 if reduce_range else 127)
    else:
        graph = rewrite_int4(graph, layers, group_size, dynamic_int8_activations=scheme == "8da4w")
    graph = rewrite_int8_embeddings(graph, embeddings)
    graph = DeadCodePass().call(graph).graph
    verify(graph)
    result = QuantizeReport(scheme, skipped=skipped)
    if samples and report_samples:
        result = layer_report(float_graph, graph, layers, scheme, samples[:report_samples], outputs,
                              uint8_results)
        result.skipped = skipped
    result.quantized = [layer.output for layer in layers + embeddings]
    return graph, result, uint8_results


def exclude_names(graph: Graph, scheme: str) -> set[str]:
    """What `exclude` may name in `graph` under `scheme`: its quantizable layers' names and its op types."""
    layers = find_layers(graph, SCHEMES[scheme][0]) + find_embeddings(graph)
    return set().union({n.op for n in graph.nodes}, *(_layer_names(layer) for layer in layers))


def _metadata(scheme: str, result: QuantizeReport, observer: str, reduce_range: bool, group_size: int,
              uint8_results: Mapping[str, tuple[str, np.ndarray, np.ndarray]]) -> dict[str, Any]:
    return {
        "scheme": scheme, "excluded": result.skipped, "observer": observer, "reduce_range": reduce_range,
        "group_size": group_size if scheme in ("int4-weight", "8da4w") else None,
        # float value -> the uint8 value standing for it (folded layers), for inspect --against
        "uint8_values": {name: {"value": q, "scale": float(scale), "zero_point": int(zp)}
                         for name, (q, scale, zp) in uint8_results.items()},
        "layers": [{"name": r.name, "op": r.op,
                    "sqnr_db": round(float(r.sqnr_db), 2) if np.isfinite(r.sqnr_db) else None}  # JSON has no inf
                   for r in result.layers]}
