"""The application harness: datasets, error metrics, and one run of an app against its float64 reference.

Metrics (Table 4 of the seed): MAPE = mean(|npu - ref| / |ref|) over entries where ref != 0, in percent;
RMSE is normalised by the reference's range: sqrt(mean((npu - ref)^2)) / (max(ref) - min(ref)), in percent
(by max|ref| when the range is zero).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.accel.runtime import DEFAULT_BITS, Runtime
from edgerun.errors import EdgerunError

APP_NAMES = ("gemm", "pagerank", "hotspot3d", "lud", "gaussian", "backprop", "blackscholes")
RANGE_LIMIT = 2.0**31  # the seed's widest range; past it products of wide data stop being meaningful here

Data = dict[str, Any]


@dataclass(frozen=True)
class App:
    name: str
    make: Callable[[int, np.random.Generator, tuple[float, float] | None], Data]  # None: the default dataset
    reference: Callable[[Data], np.ndarray]  # float64 numpy
    on_npu: Callable[[Runtime, Data], np.ndarray]
    doc: str


def get_app(name: str) -> App:
    if name not in APP_NAMES:
        raise EdgerunError(f"unknown app {name!r}; choose one of {', '.join(APP_NAMES)}")
    return importlib.import_module(f"edgerun.accel.apps.{name}").APP  # type: ignore[no-any-return]


def uniform(rng: np.random.Generator, shape: Any, value_range: tuple[float, float]) -> np.ndarray:
    lo, hi = value_range
    return rng.uniform(lo, hi, shape)


def check_range(value_range: tuple[float, float] | None) -> None:
    if value_range is None:
        return
    lo, hi = value_range
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo >= hi:
        raise EdgerunError(f"range {lo},{hi} must be two finite numbers with LO < HI")
    if max(abs(lo), abs(hi)) > RANGE_LIMIT:
        raise EdgerunError(f"range {lo:g},{hi:g} would overflow: the apps accept values within "
                           f"[-2^31, 2^31] (their products must stay exact in int64 and float64)")


def metrics(npu: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    npu, ref = np.asarray(npu, dtype=np.float64).ravel(), np.asarray(ref, dtype=np.float64).ravel()
    if npu.shape != ref.shape:
        raise EdgerunError(f"result shape {npu.shape} differs from the reference's {ref.shape}")
    if not np.all(np.isfinite(npu)):
        raise EdgerunError("the npu result holds NaN or infinite values")
    nz = ref != 0
    mape = float(np.mean(np.abs(npu[nz] - ref[nz]) / np.abs(ref[nz]))) * 100 if nz.any() else 0.0
    span = float(ref.max() - ref.min()) or float(np.abs(ref).max()) or 1.0
    rmse = float(np.sqrt(np.mean((npu - ref) ** 2))) / span * 100
    return {"mape_percent": mape, "rmse_percent": rmse}


def run_app(name: str, size: int, *, devices: int = 1, value_range: tuple[float, float] | None = None,
            seed: int = 0, bits: int = DEFAULT_BITS) -> dict[str, Any]:
    """One run: the npu version (wall time, modelled device time) against the float64 reference."""
    app = get_app(name)
    if not isinstance(size, int) or size < 2:
        raise EdgerunError(f"--size must be an integer >= 2, got {size!r}")
    check_range(value_range)
    data = app.make(size, np.random.default_rng(seed), value_range)
    t0 = time.perf_counter()
    ref = app.reference(data)
    numpy_s = time.perf_counter() - t0
    with Runtime(devices, bits=bits) as rt:
        t0 = time.perf_counter()
        out = app.on_npu(rt, data)
        wall_s = time.perf_counter() - t0
        stats = rt.stats()
    result: dict[str, Any] = {"app": name, "size": size, "devices": devices,
                              "range": list(value_range) if value_range else "default", "seed": seed}
    result.update(metrics(out, ref))
    result.update({"device_model_s": stats["device_model_s"], "wall_s": wall_s, "numpy_s": numpy_s,
                   "instructions": stats["instructions"], "bytes_in": stats["bytes_in"],
                   "bytes_out": stats["bytes_out"], "tensorize_s": stats["tensorize_s"]})
    return result
