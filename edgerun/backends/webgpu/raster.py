"""Raster kernels: the generic strided region copy, read through the IR's `Region` (named fields).

A raster is a fill dispatch (when it has a fill), then one dispatch over all regions driven by a small i32
storage buffer of region parameters: the region's twelve integers (`Region.to_list`) plus its first thread,
each thread finding its region by a scan. Regions that overlap get one dispatch each, so the later region
wins, as in the reference.
"""

from __future__ import annotations

import numpy as np

from edgerun.backends.webgpu.wgsl import STORAGE_TYPE, WGSL_TYPE, Kernel, literal, shader_source
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import REGION_LEN, Region, regions_of

PARAMS_PER_REGION = REGION_LEN + 1  # the stored integers, then the region's first thread


def raster_kernels(node: Node, graph: Graph) -> list[Kernel]:
    """A fill dispatch (when the raster has a fill) and region copies driven by a table of region parameters.

    One copy dispatch covers all regions (thread t finds its region by a scan over cumulative sizes) unless
    two regions write the same output element: then one dispatch per region keeps the reference's order.
    """
    out_name = node.outputs[0]
    out = graph.specs[out_name]
    t = WGSL_TYPE[out.dtype]
    sources = list(node.inputs)
    kernels: list[Kernel] = []
    fill = node.attrs.get("fill")
    if fill is not None:
        lit = literal(fill, out.dtype)
        kernels.append(Kernel(shader_source([], [f"out0[idx] = {lit};"], [STORAGE_TYPE[out.dtype]], out.numel,
                                            status=False),
                              [out_name], out.numel, [node.name], label=f"{node.name}:fill"))
    regions = [r for r in regions_of(node.attrs) if r.numel > 0]
    if not regions:
        return kernels
    groups = [regions] if not regions_overlap(regions, out.numel) else [[r] for r in regions]
    n = PARAMS_PER_REGION
    # Offsets into one region's parameters, named after Region's fields (its to_list order).
    src, so, ss, do, ds, size, first = 0, 1, 2, 5, 6, 9, REGION_LEN
    for group in groups:
        table, total = [], 0
        for r in group:
            table += [*r.to_list(), total]
            total += r.numel
        body = ["var reg: u32 = 0u;",
                f"for (var k: u32 = 1u; k < {len(group)}u; k = k + 1u) "
                f"{{ if (u32(params[k * {n}u + {first}u]) <= idx) {{ reg = k; }} }}",
                f"let p = reg * {n}u;", f"let local = i32(idx) - params[p + {first}u];",
                f"let n2 = params[p + {size + 2}u];", f"let n1 = params[p + {size + 1}u];",
                "let i2 = local % n2;", "let i1 = (local / n2) % n1;", "let i0 = local / (n2 * n1);",
                f"let so = params[p + {so}u] + i0 * params[p + {ss}u] + i1 * params[p + {ss + 1}u] "
                f"+ i2 * params[p + {ss + 2}u];",
                f"let dst = params[p + {do}u] + i0 * params[p + {ds}u] + i1 * params[p + {ds + 1}u] "
                f"+ i2 * params[p + {ds + 2}u];",
                f"var v: {t};", f"switch (params[p + {src}u]) {{"]
        for k in range(len(sources)):
            body.append(f"  case {k}: {{ v = in{k}[so]; }}" if k else "  case 0, default: { v = in0[so]; }")
        body += ["}", "out0[dst] = v;"]
        code = shader_source([STORAGE_TYPE[graph.specs[s].dtype] for s in sources], body,
                             [STORAGE_TYPE[out.dtype]], total, status=False, params=True)
        kernels.append(Kernel(code, [*sources, out_name], total, [node.name],
                              params=np.asarray(table, np.int32), label=f"{node.name}:copy"))
    return kernels


def regions_overlap(regions: list[Region], numel: int) -> bool:
    """Whether two regions write one output element (then their order matters)."""
    if len(regions) < 2:
        return False
    seen = np.zeros(numel, np.int32)
    for r in regions:
        np.add.at(seen, r.index_grids()[0], 1)
    return bool((seen > 1).any())


