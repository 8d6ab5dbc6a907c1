"""`edgerun zoo list`, `edgerun zoo export NAME -o FILE [--inputs NPZ]`, `edgerun export module:factory -o FILE`.

`edgerun export` imports a Python path `package.module:factory`; calling `factory()` must return
`(module, example_args)`: a torch.nn.Module and a tuple of example tensors. The program is specialised to the
example shapes, optimised by the default pass pipeline (unless --no-optimize) and saved to FILE.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any

from edgerun.errors import EdgerunError


def register(subparsers: Any) -> None:
    zoo = subparsers.add_parser("zoo", help="the model zoo: list models, export one to a program file")
    zsub = zoo.add_subparsers(dest="zoo_command", metavar="COMMAND", required=True)
    p = zsub.add_parser("list", help="list the zoo's models")
    p.set_defaults(func=_zoo_list)
    p = zsub.add_parser("export", help="build a zoo model, export it and save the program file")
    p.add_argument("name", help="a model name from `edgerun zoo list`")
    p.add_argument("-o", "--output", required=True, help="program file to write")
    p.add_argument("--no-optimize", action="store_true", help="save the frontend's graph without running passes")
    p.add_argument("--inputs", metavar="NPZ",
                   help="also write the example inputs it was exported with, by input name (for run/carve --inputs)")
    p.set_defaults(func=_zoo_export)

    p = subparsers.add_parser("export", help="export a PyTorch model (module:factory) to a program file",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("factory", help="package.module:function returning (torch.nn.Module, example_args)")
    p.add_argument("-o", "--output", required=True, help="program file to write")
    p.add_argument("--name", help="program name stored in its metadata (default: the factory's name)")
    p.add_argument("--no-optimize", action="store_true", help="save the frontend's graph without running passes")
    p.set_defaults(func=_export_factory)


def _zoo_list(args: argparse.Namespace) -> int:
    from edgerun import zoo

    names = zoo.list_models()
    width = max(len(n) for n in names)
    for name in names:
        print(f"{name:<{width}}  {zoo.get(name).description}")
    return 0


class _Status:
    """Status lines on stderr with elapsed time: export is a handful of long steps, not a countable loop."""

    def __init__(self, total: int) -> None:
        self.total, self.step, self.start = total, 0, time.perf_counter()

    def __call__(self, message: str) -> None:
        self.step += 1
        print(f"[{self.step}/{self.total}] {message} ({time.perf_counter() - self.start:.1f} s)",
              file=sys.stderr, flush=True)


def _zoo_export(args: argparse.Namespace) -> int:
    from edgerun import zoo

    status = _Status(4)
    spec = zoo.get(args.name)
    status(f"building {spec.name}")
    module = spec.build()
    example = spec.example_inputs()
    _export_and_save(module, example, spec.name, args, status)
    return 0


def _export_factory(args: argparse.Namespace) -> int:
    status = _Status(4)
    path, sep, attr = args.factory.partition(":")
    if not sep or not path or not attr:
        raise EdgerunError(f"expected package.module:factory, got {args.factory!r}")
    sys.path.insert(0, os.getcwd())  # so a module beside the user resolves, as with `python -m`
    try:
        factory = getattr(importlib.import_module(path), attr)
    except (ImportError, AttributeError) as exc:
        raise EdgerunError(f"cannot import {args.factory!r}: {exc}") from exc
    status(f"calling {args.factory}()")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise EdgerunError(f"{args.factory}() must return (module, example_args), got {type(made).__name__}")
    module, example = made
    if not isinstance(example, tuple):
        example = (example,)
    _export_and_save(module, example, args.name or attr, args, status)
    return 0


def _export_and_save(module: Any, example: tuple[Any, ...], name: str, args: argparse.Namespace,
                     status: _Status) -> None:
    from edgerun.frontends.program_maker import make_program
    from edgerun.frontends.torch.export import export_graph, torch_version

    status("capturing with torch.export and converting to edgerun IR")
    graph = export_graph(module, example)
    status("running the default pass pipeline" if not args.no_optimize else "skipping passes (--no-optimize)")
    program = make_program(graph, frontend=f"torch {torch_version()}", name=name, run_passes=not args.no_optimize)
    status(f"saving {args.output}")
    program.save(args.output)
    counts = program.graph.op_counts()
    print(f"wrote {args.output}: {len(program.graph.nodes)} nodes ({len(counts)} op kinds), "
          f"{program.graph.weight_bytes() / 1e6:.1f} MB of weights, inputs "
          f"{', '.join(f'{n}: {program.graph.specs[n]}' for n in program.graph.inputs)}")
    if getattr(args, "inputs", None):
        import numpy as np

        arrays = {n: np.asarray(x.detach().numpy() if hasattr(x, "detach") else x)
                  for n, x in zip(program.graph.inputs, example)}
        np.savez(args.inputs, **arrays)  # type: ignore[arg-type]
        print(f"wrote {args.inputs}: the example inputs, by input name")
