"""`edgerun generate`, `edgerun chat`, `edgerun llm export`, `edgerun llm serve`: LLMs from GGUF files.

MODEL is a .gguf file, a Hugging Face model folder (config.json + safetensors) or a program file written by
`edgerun llm export`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from edgerun.errors import EdgerunError


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a .gguf file, a Hugging Face model folder, or a file from `edgerun llm export`")
    p.add_argument("--context", type=int, default=None, help="KV-cache positions (default: min(model's, 2048))")
    p.add_argument("--backends", default="auto",
                   help="runtime backends: 'auto' (default: the load-time search places the programs) or a "
                        "comma-separated list")
    p.add_argument("--dequantize", action="store_true",
                   help="run float32 weights instead of the GGUF's packed int4/int8 ones")


def _sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("-n", "--max-new-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("generate", help="continue a prompt with an LLM (streams the text)")
    _model_args(p)
    p.add_argument("--prompt", required=True, help="the text to continue ('-' reads stdin)")
    _sampling_args(p, 128)
    p.set_defaults(func=_generate)

    p = subparsers.add_parser("chat", help="chat with an LLM in the terminal (multi-turn, streaming)")
    _model_args(p)
    p.add_argument("--system", default=None, help="a system message")
    _sampling_args(p, 512)
    p.set_defaults(func=_chat)

    llm = subparsers.add_parser("llm", help="LLM programs: export a GGUF, serve an OpenAI-compatible API")
    lsub = llm.add_subparsers(dest="llm_command", metavar="COMMAND", required=True)
    p = lsub.add_parser("export", help="write the model as one program file: methods prefill and decode, the "
                                       "weights once, the KV cache as state, the tokenizer and chat template")
    p.add_argument("model", help="a .gguf file or a Hugging Face model folder")
    p.add_argument("-o", "--output", required=True, help="program file to write (e.g. model.edgerun)")
    p.add_argument("--context", type=int, default=None, help="KV-cache positions (default: min(model's, 2048))")
    p.add_argument("--chunk", type=int, default=64, help="the prefill method's length (default 64)")
    p.add_argument("--dequantize", action="store_true", help="float32 weights instead of the GGUF's packed ones")
    p.set_defaults(func=_export)
    p = lsub.add_parser("serve", help="serve /v1/chat/completions, /v1/completions, /v1/models, /health and "
                                      "/metrics (OpenAI's API)")
    _model_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    _serve_args(p)
    p.set_defaults(func=_serve)


def _serve_args(p: argparse.ArgumentParser) -> None:
    from edgerun.llm.serving.config import ServerConfig

    d = ServerConfig()
    p.add_argument("--api-key-file", default=None,
                   help="a file of API keys, one a line; then every request but /health needs "
                        "'Authorization: Bearer <key>'")
    p.add_argument("--alias", action="append", default=[], help="another name `model` may give (repeatable)")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens,
                   help=f"new tokens when a request gives no max_tokens (default {d.default_max_tokens})")
    p.add_argument("--max-tokens-limit", type=int, default=None,
                   help="the most new tokens one request may ask for (default: the context)")
    p.add_argument("--max-pending-tokens", type=int, default=None,
                   help="new tokens all admitted requests may reserve together; past it 503 (default: no bound)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="requests decoding together in one model call (continuous batching; default 8, or as "
                        "many as --kv-cache-mb holds; 1: one request at a time)")
    p.add_argument("--kv-cache-mb", type=int, default=1024,
                   help="memory for the KV caches: one per batch slot at --context, and one for prompts "
                        "(default 1024)")
    p.add_argument("--max-queue", type=int, default=d.max_queue,
                   help=f"requests waiting for a batch slot; past it 429 (default {d.max_queue})")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help=f"request body limit, checked before the body is read (default {d.max_body_bytes})")
    p.add_argument("--max-prompt-chars", type=int, default=d.max_prompt_chars,
                   help=f"prompt or message text limit (default {d.max_prompt_chars})")
    p.add_argument("--template-timeout", type=float, default=d.template_timeout_s,
                   help=f"seconds a chat template may take to render (default {d.template_timeout_s:g})")
    p.add_argument("--prefill-chunks", type=int, default=d.prefill_chunks,
                   help="prefill calls of waiting requests' prompts at most between two decode steps of the "
                        "running ones: more fills the batch sooner, fewer keeps their tokens coming "
                        f"(default {d.prefill_chunks})")
    p.add_argument("--prefix-cache-mb", type=int, default=d.prefix_cache_bytes >> 20,
                   help="host memory for the KV rows of earlier prompts, reused by prompts that start the same "
                        f"way (0: off; default {d.prefix_cache_bytes >> 20})")
    p.add_argument("--embedding-program", default=None,
                   help="an encoder program (input_ids[, attention_mask, token_type_ids] -> embedding) to serve "
                        "at /v1/embeddings")
    p.add_argument("--embedding-tokenizer", default=None,
                   help="its Hugging Face tokenizer.json (needed with --embedding-program)")
    p.add_argument("--embedding-name", default=None, help="its model name (default: the program file's name)")
    p.add_argument("--template-memory-mb", type=int, default=d.template_memory_bytes >> 20,
                   help=f"address space of a template worker (default {d.template_memory_bytes >> 20})")


def _load(args: argparse.Namespace, **options: Any) -> Any:
    import edgerun.llm

    backends = args.backends
    if backends and backends != "auto":
        backends = [b for b in backends.split(",") if b]
    from edgerun.cli.progress import Progress

    start = time.perf_counter()
    with Progress(f"loading {args.model}"):
        model = edgerun.llm.load(args.model, dequantize=args.dequantize, context=args.context, backends=backends,
                                 **options)
    packed = any(n.op == "matmul_int4" for n in model.runner.decode.graph.nodes)
    batch = f"; batch size {model.slots}, KV cache {model.kv_cache_bytes >> 20} MB" if "slots" in options else ""
    print(f"[loaded {model.name} in {time.perf_counter() - start:.1f} s; weights "
          f"{'packed (int4 matmuls)' if packed else 'float32'}; context {model.context}{batch}]", file=sys.stderr)
    return model


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
            "top_p": args.top_p, "min_p": args.min_p, "repetition_penalty": args.repetition_penalty,
            "seed": args.seed, "stop": args.stop}


def _print_piece(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _stats(result: Any) -> str:
    return (f"[{result.prompt_tokens} prompt tokens in {result.prefill_seconds:.2f} s, {len(result.token_ids)} "
            f"new at {result.decode_tokens_per_second:.1f} tokens/s; {result.finish_reason}]")


def _generate(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = _load(args)
    result = model.generate(prompt, on_text=_print_piece, **_sampling(args))
    print()
    print(_stats(result), file=sys.stderr)
    return 0


def _chat(args: argparse.Namespace) -> int:
    model = _load(args)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    print("[type a message; an empty line or Ctrl-D ends the chat]", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        try:
            result = model.chat(messages, on_text=_print_piece, **_sampling(args))
        except EdgerunError as exc:
            messages.pop()
            print(f"\nedgerun: error: {exc}", file=sys.stderr)
            continue
        print()
        print(_stats(result), file=sys.stderr)
        messages.append({"role": "assistant", "content": result.text})


def _export(args: argparse.Namespace) -> int:
    from edgerun.llm.program_file import export_program

    start = time.perf_counter()
    print(export_program(args.model, args.output, context=args.context, chunk=args.chunk,
                         dequantize=args.dequantize))
    print(f"[exported in {time.perf_counter() - start:.1f} s]", file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from edgerun.llm.server import serve
    from edgerun.llm.serving.config import ServerConfig, read_api_keys

    config = ServerConfig(api_keys=read_api_keys(args.api_key_file) if args.api_key_file else frozenset(),
                          aliases=tuple(args.alias), default_max_tokens=args.default_max_tokens,
                          max_tokens_limit=args.max_tokens_limit, max_pending_tokens=args.max_pending_tokens,
                          max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                          max_prompt_chars=args.max_prompt_chars, template_timeout_s=args.template_timeout,
                          template_memory_bytes=args.template_memory_mb << 20,
                          prefix_cache_bytes=args.prefix_cache_mb << 20, prefill_chunks=args.prefill_chunks)
    config.check()  # a bad option fails before the model loads
    embedder = None
    if args.embedding_program or args.embedding_tokenizer:
        from edgerun.llm.serving.embeddings import Embedder

        if not (args.embedding_program and args.embedding_tokenizer):
            raise EdgerunError("--embedding-program and --embedding-tokenizer go together")
        embedder = Embedder.load(args.embedding_program, args.embedding_tokenizer, args.embedding_name)
    if not 1 <= args.batch_size <= 64 or args.kv_cache_mb < 1:
        raise EdgerunError(f"--batch-size must be 1 to 64 and --kv-cache-mb >= 1, got {args.batch_size} and "
                           f"{args.kv_cache_mb}")
    model = _load(args, slots=args.batch_size, kv_cache_bytes=args.kv_cache_mb << 20)
    serve(model, host=args.host, port=args.port, config=config, embedder=embedder)
    return 0
