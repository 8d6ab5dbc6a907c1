"""Quantization flows: a float Program in, an int8 or int4 Program out (docs/quantization.md).

    q = edgerun.quantize(program, scheme="int8-static", calibration="samples.npz")

Sits above the backends: calibration and the per-layer report run the reference interpreter.
"""

from edgerun.quantization.flow import (
    SCHEMES,
    LayerReport,
    QuantizeReport,
    load_calibration,
    quantize,
    quantize_with_report,
)

__all__ = ["SCHEMES", "LayerReport", "QuantizeReport", "load_calibration", "quantize", "quantize_with_report"]
