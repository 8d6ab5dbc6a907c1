"""Op definitions. Importing this package registers every op (see edgerun.ir.registry)."""

from edgerun.ir.ops import (  # noqa: F401
    atomic,
    control_flow_ops,
    nn_ops,
    quant_ops,
    raster,
    shape_ops,
    state_ops,
    symbolic_ops,
)
