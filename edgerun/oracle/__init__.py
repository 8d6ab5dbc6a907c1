"""The oracle: the IR's executable semantics, in numpy, at the bottom of the layers beside `edgerun.ir`.

- `kernels.py`: one kernel per atomic op and the raster (`KERNELS`), numerics pinned and documented;
- `conv_algorithms.py`: the convolution variants (im2col, pointwise, depthwise, Winograd) and their work;
- `interpreter.py`: the one node walk (`walk`), `interpret`, `run_node`, `run_partition`, `bind_inputs`.

Passes (constant folding), both frontends, the runtime, the developer tools and the reference backend use
it; it imports only `edgerun.ir` and `edgerun.errors`.
"""

from edgerun.oracle.interpreter import bind_inputs, interpret, run_node, run_partition, walk
from edgerun.oracle.kernels import KERNELS, Kernel

__all__ = ["KERNELS", "Kernel", "bind_inputs", "interpret", "run_node", "run_partition", "walk"]
