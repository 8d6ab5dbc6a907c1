"""`edgerun web export MODEL -o DIR` and `edgerun web serve DIR`: an LLM as a static bundle for the browser."""

from __future__ import annotations

import argparse
import time
from typing import Any


def register(subparsers: Any) -> None:
    web = subparsers.add_parser("web", help="the browser runtime: export an LLM as a WebGPU bundle, serve it")
    sub = web.add_subparsers(dest="web_command", metavar="COMMAND", required=True)
    p = sub.add_parser("export", help="write the static bundle (plan, shaders, weights, tokenizer, chat page)")
    p.add_argument("model", help="a .gguf file or a Hugging Face model folder")
    p.add_argument("-o", "--output", required=True, help="bundle folder to write")
    p.add_argument("--context", type=int, default=256, help="KV cache positions (default 256)")
    p.add_argument("--dense", action="store_true", help="dequantize int4 projections instead of keeping them packed")
    p.add_argument("--chunk", type=int, default=16,
                   help="prompt tokens per prefill replay (default 16; 2 up to the context)")
    p.set_defaults(func=_export)
    p = sub.add_parser("serve", help="serve a bundle with its chat page")
    p.add_argument("folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.set_defaults(func=_serve)


def _export(args: argparse.Namespace) -> int:
    from edgerun.web.bundle import export_web

    start = time.perf_counter()
    for path in export_web(args.model, args.output, context=args.context, int4=not args.dense,
                          chunk=args.chunk):
        print(path)
    print(f"[exported in {time.perf_counter() - start:.1f} s]")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from edgerun.web.server import serve

    serve(args.folder, args.host, args.port)
    return 0
