"""The `edgerun` command. Each area registers its subcommands from its own module, listed in COMMAND_MODULES."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from edgerun.errors import EdgerunError

# Each module exposes `register(subparsers: argparse._SubParsersAction) -> None` and sets
# `func` on its parsers via `set_defaults(func=...)`; func(args) returns an exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "edgerun.cli.ops",
    "edgerun.cli.remote",
    "edgerun.cli.runtime",
    "edgerun.cli.fleet",
    "edgerun.cli.stream",
    "edgerun.cli.devtools",
    "edgerun.cli.onnx",
    "edgerun.cli.search",
    "edgerun.cli.zoo",
    "edgerun.cli.accel",
    "edgerun.cli.quantize",
    "edgerun.cli.llm",
    "edgerun.cli.web",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgerun", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("edgerun.cli."):
                continue  # an area not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EdgerunError as exc:
        print(f"edgerun: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.filename is None:
            raise
        # A path typed wrong, a folder where a file goes, a file that may not be read: one line naming it
        # (each command checks what it can say better, e.g. "not a test bundle"; this catches the rest).
        print(f"edgerun: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgerun: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
