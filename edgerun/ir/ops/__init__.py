"""Op definitions. Importing this package registers every op (see edgerun.ir.registry)."""

from edgerun.ir.ops import (  # noqa: F401
    atomic,
    atomic_gradients,
    cache_attention_ops,
    control_flow_ops,
    conv_transpose_ops,
    data_dependent_ops,
    image_ops,
    nn_gradients,
    nn_ops,
    quant_add_ops,
    quant_ops,
    raster,
    raster_gradient,
    resize_ops,
    shape_ops,
    state_ops,
    string_ops,
    symbolic_ops,
    top_k_ops,
    window_gradients,
)
