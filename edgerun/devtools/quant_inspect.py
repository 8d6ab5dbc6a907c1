"""A quantized program against its float source, value by value: where the int8 program loses accuracy.

`edgerun quantize` keeps every float value's name (a quantized layer's result is named as the float layer's
output), so the two programs share names. Both run on the reference interpreter with the same inputs; each
float value the quantized program still computes is compared with the float program's, and a value it only
holds as uint8 (a layer whose ReLU was folded into its requantization, listed in the program's
metadata["quantization"]["uint8_values"]) is dequantized first. Unlike `inspect` against a backend, error is
expected here: the report gives each value's SQNR and names the first one below `min_snr_db`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.devtools.programs import InputSet, LoadedGraph
from edgerun.errors import EdgerunError
from edgerun.oracle import interpret


@dataclass(frozen=True)
class ValueComparison:
    index: int  # position of the producing node in the float program's execution order
    value: str
    op: str  # of the float node producing it
    snr_db: float
    cosine: float
    max_abs: float
    via_uint8: bool  # compared through the uint8 value standing for it

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "value": self.value, "op": self.op, "via_uint8": self.via_uint8,
                "snr_db": None if math.isinf(self.snr_db) else round(self.snr_db, 3),
                "cosine": self.cosine, "max_abs": self.max_abs}


@dataclass
class QuantCompareReport:
    scheme: str
    min_snr_db: float
    values: list[ValueComparison] = field(default_factory=list)
    missing: int = 0  # float values the quantized program computes no counterpart of (weights' consumers etc.)

    @property
    def first_below(self) -> ValueComparison | None:
        return next((v for v in self.values if v.snr_db < self.min_snr_db), None)

    @property
    def output(self) -> ValueComparison | None:
        return self.values[-1] if self.values else None

    def summary(self) -> str:
        first = self.first_below
        head = f"{self.scheme} program against its float source: {len(self.values)} values compared"
        if first is None:
            return f"{head}; every one at or above {self.min_snr_db:g} dB SQNR"
        return (f"{head}; the first below {self.min_snr_db:g} dB is {first.value!r} ({first.op}, #{first.index}): "
                f"{first.snr_db:.1f} dB, cosine {first.cosine:.5f}")

    def table(self, limit: int = 60) -> str:
        head = f"{'#':>4} {'value':<30} {'op':<12} {'SQNR dB':>8} {'cosine':>9} {'max abs':>10}"
        lines = [head, "-" * len(head)]
        shown = self.values if len(self.values) <= limit else self.values[:limit // 2] + self.values[-limit // 2:]
        first = self.first_below
        for v in shown:
            mark = "  <- first below" if v is first else (" (uint8)" if v.via_uint8 else "")
            lines.append(f"{v.index:>4} {v.value[:30]:<30} {v.op[:12]:<12} {v.snr_db:>8.1f} {v.cosine:>9.5f} "
                         f"{v.max_abs:>10.3g}{mark}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        first = self.first_below
        return {"scheme": self.scheme, "min_snr_db": self.min_snr_db, "missing": self.missing,
                "first_below": first.to_json() if first else None, "values": [v.to_json() for v in self.values]}

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_json(), fh, indent=1)


def _stats(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    noise, signal = float(np.sum((r - g) ** 2)), float(np.sum(r ** 2))
    snr = math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)
    norm = float(np.linalg.norm(r) * np.linalg.norm(g))
    cosine = float(r @ g / norm) if norm else 1.0
    return snr, cosine, float(np.max(np.abs(r - g))) if r.size else 0.0


def quantization_metadata(quantized: LoadedGraph, source: LoadedGraph, role: str) -> Mapping[str, Any]:
    """`quantized`'s metadata["quantization"], once it is checked to be a quantized program of `source`'s
    inputs (`role` names it in the error)."""
    meta = (quantized.program.metadata if quantized.program else {}).get("quantization")
    if not isinstance(meta, Mapping):
        raise EdgerunError(f"{role} is not a quantized one (no metadata['quantization']: "
                           "make it with `edgerun quantize`)")
    if list(source.graph.inputs) != list(quantized.graph.inputs):
        raise EdgerunError(f"the float program's inputs {source.graph.inputs} are not the quantized program's "
                           f"{quantized.graph.inputs}: is it the source this program was quantized from?")
    return meta


def compare_quantized(quantized: LoadedGraph, source: LoadedGraph, inputs: InputSet,
                      min_snr_db: float = 20.0) -> QuantCompareReport:
    """SQNR of every float value of `source` that `quantized` computes too (by name), in execution order."""
    meta = quantization_metadata(quantized, source, "the first program")
    uint8 = {str(name): (str(v["value"]), np.float32(v["scale"]), int(v["zero_point"]))
             for name, v in meta.get("uint8_values", {}).items()}
    by_uint8 = {q: name for name, (q, _, _) in uint8.items()}
    float_specs = {v: s for v, s in source.graph.specs.items() if s.dtype.value == "float32"}
    wanted = {v for v in float_specs if v in quantized.graph.specs
              and quantized.graph.specs[v] == float_specs[v]} | set(uint8)
    got: dict[str, np.ndarray] = {}

    def hook(node: Any, args: list[np.ndarray], outs: list[np.ndarray]) -> None:
        for name, value in zip(node.outputs, outs):
            if name in by_uint8:
                fname = by_uint8[name]
                _, scale, zp = uint8[fname]
                got.setdefault(fname, (value.astype(np.float32) - np.float32(zp)) * scale)
            elif name in wanted and name not in uint8:
                got[name] = value.copy()

    interpret(quantized.graph, [inputs[n] for n in quantized.graph.inputs], hook=hook)
    report = QuantCompareReport(str(meta.get("scheme", "?")), min_snr_db)
    index = 0

    def compare(node: Any, args: list[np.ndarray], outs: list[np.ndarray]) -> None:
        nonlocal index
        for name, value in zip(node.outputs, outs):
            if name not in float_specs or name in source.graph.constants:
                continue
            if name not in got:
                report.missing += 1
                continue
            snr, cosine, max_abs = _stats(value, got[name])
            report.values.append(ValueComparison(index, name, node.op, snr, cosine, max_abs, name in uint8))
        index += 1

    interpret(source.graph, [inputs[n] for n in source.graph.inputs], hook=compare)
    return report
