"""Zoo programs at small input sizes for the webgpu tests and benchmarks (lavapipe is a CPU: keep them small).

CNNs take a 64x64 image (32x32 is too small for SqueezeNet's ceil-mode pools to stay meaningful), MiniLM 8
tokens; ViT-Tiny and the decoder keep their fixed sizes (position tables). Programs are exported once per
directory and reused.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

CNNS = ("mobilenet_v2", "resnet18", "resnet50", "squeezenet1_1", "shufflenet_v2")


def small_inputs(name: str) -> tuple[Any, ...]:
    from edgerun.zoo import get

    if name in CNNS:
        from edgerun.zoo.inputs import natural_image

        return (natural_image(64, seed=0),)
    if name == "minilm_l6":
        from edgerun.zoo.minilm import EXAMPLE_SENTENCES, tokenize

        return tokenize(EXAMPLE_SENTENCES[:1], length=8)
    return get(name).example_inputs()


def export_small(name: str, directory: str) -> tuple[Any, list[np.ndarray]]:
    """(Program, numpy inputs) of zoo model `name` at its small size, cached as DIR/NAME.edgerun + .npz."""
    from edgerun.program import Program

    path = os.path.join(directory, f"{name}.edgerun")
    feeds = os.path.join(directory, f"{name}.npz")
    if os.path.exists(path) and os.path.exists(feeds):
        with np.load(feeds, allow_pickle=False) as z:
            return Program.read(path), [z[k] for k in sorted(z.files, key=lambda k: int(k[4:]))]
    from edgerun.frontends.torch import export
    from edgerun.zoo import get

    inputs = small_inputs(name)
    program = export(get(name).build(), inputs, name=name)
    program.save(path)
    arrays = [t.numpy() for t in inputs]
    np.savez(feeds, **{f"arr_{k}": a for k, a in enumerate(arrays)})
    return program, arrays
