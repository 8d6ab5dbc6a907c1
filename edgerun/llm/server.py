"""`edgerun llm serve`: an OpenAI-compatible HTTP server (FastAPI) for one loaded model.

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (both with `stream: true` over
server-sent events; `stream_options: {"include_usage": true}` adds the usage chunk), POST /v1/embeddings
when an encoder program is served beside the model, GET /health and GET /metrics (Prometheus).

What guards it (edgerun/llm/serving/): the API key and the body size are checked before a route reads the
body; prompt text, stop strings and grammars are bounded before they are tokenised or compiled; the chat
template is rendered in a worker process with a time and a memory bound; tokenising and grammar compilation
run off the event loop. Generation runs on the engine's thread (serving/engine.py) with continuous batching:
requests join the running batch as slots free up, first come first served, and leave it when they end; a
client that leaves stops its request within one step, and past the queue or token bounds a request is
refused with 429 or 503. Every error is OpenAI's error JSON
(`{"error": {"message", "type", "param", "code"}}`) and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from edgerun.errors import EdgerunError
from edgerun.llm.generation import GenerationResult
from edgerun.llm.model import GenerationRequest, LanguageModel, stop_token_ids, template_tokens
from edgerun.llm.serving.api_error import ApiError
from edgerun.llm.serving.config import ServerConfig
from edgerun.llm.serving.constraint import GrammarCompiler, GrammarConstraint
from edgerun.llm.serving.embeddings import Embedder, encode_vector
from edgerun.llm.serving.engine import Engine, Job
from edgerun.llm.serving.guard import BodyTooLarge, Guard
from edgerun.llm.serving.metrics import ServerMetrics
from edgerun.llm.serving.template_pool import TemplatePool


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI fields we do not use (user, logit_bias...) are ignored
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # {"include_usage": true}: a last chunk with the usage
    n: int = 1
    response_format: dict[str, Any] | None = None  # OpenAI's: text, json_object, json_schema
    grammar: str | None = None  # llama-server's: a GBNF grammar the output follows
    regex: str | None = None  # the output matches this regular expression


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # `user` and the like are ignored
    input: str | list[str]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None


def create_app(model: LanguageModel, config: ServerConfig | None = None, *, embedder: Embedder | None = None,
               step_gate: Callable[[], None] | None = None) -> FastAPI:
    """The app serving `model` (and `embedder`'s encoder program at /v1/embeddings). `step_gate` is
    handed to the engine, which calls it before every model call (tests pace the engine with it)."""
    config = config or ServerConfig()
    config.check()
    model_id = model.name
    names = (model_id, *config.aliases)
    metrics = ServerMetrics()
    engine = Engine(model, metrics, max_queue=config.max_queue, max_pending_tokens=config.max_pending_tokens,
                    prefix_cache_bytes=config.prefix_cache_bytes, prefill_chunks=config.prefill_chunks,
                    step_gate=step_gate)
    templates = TemplatePool(workers=config.template_workers, timeout_s=config.template_timeout_s,
                             memory_bytes=config.template_memory_bytes, max_chars=config.max_prompt_chars)
    # Where generation stops (eos, end of turn, ...): model.stop_token_ids's rule, but the chat template it
    # renders to find the end-of-turn token goes through the bounded renderer, once, at startup.
    stops: set[int] = set()
    grammars = GrammarCompiler(model.tokenizer, model.eos_token_id, [], config.max_grammar_chars)

    def render(template: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               special_tokens: dict[str, str] | None = None) -> str:
        return templates.render(template, messages, add_generation_prompt=add_generation_prompt,
                                special=special_tokens)
    token_limit = min(config.max_tokens_limit or model.context, model.context)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        if model.info.chat_template:
            await run_in_threadpool(templates.start)
        stops.update(await run_in_threadpool(stop_token_ids, model.info, model.tokenizer, render))
        grammars.stop_ids = sorted(stops)
        try:
            yield
        finally:
            engine.stop()
            templates.close()

    app = FastAPI(title="edgerun llm", version="1", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.config = engine, metrics, config
    app.add_middleware(Guard, api_keys=config.api_keys, max_body_bytes=config.max_body_bytes)

    @app.exception_handler(EdgerunError)
    async def _edgerun_error(request: Request, exc: EdgerunError) -> JSONResponse:
        return ApiError(400, str(exc)).response()

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc, BodyTooLarge):
            return exc.api_error.response()
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return ApiError(exc.status_code, str(exc.detail), kind, headers=dict(exc.headers or {})).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return ApiError(400, f"invalid request: {where}: {first.get('msg', exc)}").response()

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        served = [*names, *([embedder.name] if embedder is not None else [])]
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "edgerun"}
                                           for n in served]}

    def check_request(req: _Sampling) -> None:
        """What can be refused before the prompt is tokenised."""
        if req.model is not None and req.model not in names:
            raise ApiError(404, f"model {req.model!r} is not served here (this server has "
                                f"{', '.join(repr(n) for n in names)})", code="model_not_found")
        if req.n != 1:
            raise EdgerunError("n must be 1")
        if req.stream_options is not None and not req.stream:
            raise EdgerunError("stream_options is only allowed when stream is true")
        for name in ("max_completion_tokens", "max_tokens"):
            value = getattr(req, name)
            if value is not None and not 1 <= value <= token_limit:
                raise EdgerunError(f"{name} must be between 1 and {token_limit}, got {value}")
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        if len(stops) > config.max_stop:
            raise EdgerunError(f"stop may hold at most {config.max_stop} strings, got {len(stops)}")
        if any(len(s) > config.max_stop_chars for s in stops):
            raise EdgerunError(f"a stop string may be at most {config.max_stop_chars} characters long")

    def check_prompt_size(chars: int) -> None:
        if chars > config.max_prompt_chars:
            raise EdgerunError(f"the prompt has {chars} characters; this server's limit is "
                               f"{config.max_prompt_chars}")

    def prepare(req: _Sampling, prompt: Any) -> tuple[GenerationRequest, GrammarConstraint | None]:
        """Tokenise, check against the context and compile the grammar (blocking: run in a thread)."""
        ids = model.encode_prompt(prompt)
        asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = asked if asked is not None else \
            max(1, min(config.default_max_tokens, token_limit, model.context - len(ids)))
        args: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": req.temperature, "top_p": req.top_p,
                                "top_k": req.top_k, "min_p": req.min_p, "repetition_penalty": req.repetition_penalty,
                                "seed": req.seed, "stop": req.stop}
        # ignore_eos: the stop ids are given (`stops`), so prepare() does not render the template itself.
        request = model.prepare(ids, **args, stop_token_ids=sorted(stops), ignore_eos=True)
        grammar = grammars.grammar_for(req.response_format, req.grammar, req.regex)
        return request, (grammars.constraint(grammar) if grammar is not None else None)

    def submit(request: GenerationRequest, constraint: GrammarConstraint | None) -> tuple[Job, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(kind: str, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed (shutdown): nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, (kind, value))
        job = Job(request, emit, constraint)
        engine.submit(job)
        return job, events

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        check_request(req)
        prompt: Any = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise EdgerunError("one prompt per request")
            prompt = prompt[0]
        if isinstance(prompt, str):
            check_prompt_size(len(prompt))
        prepared, constraint = await run_in_threadpool(prepare, req, prompt)
        job, events = submit(prepared, constraint)
        ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            def chunk(piece: str | None, finish: str | None) -> dict[str, Any]:
                return {"id": ident, "object": "text_completion", "created": created, "model": model_id,
                        "choices": [{"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}]}
            return StreamingResponse(_sse(job, events, chunk, None, _wants_usage(req)),
                                     media_type="text/event-stream")
        result = await _collect(job, events, request)
        if result is None:
            return Response(status_code=499)  # the client has gone; nobody reads this
        return {"id": ident, "object": "text_completion", "created": created, "model": model_id,
                "choices": [{"index": 0, "text": result.text, "logprobs": None,
                             "finish_reason": result.finish_reason}], "usage": _usage(result)}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatRequest, request: Request) -> Any:
        check_request(req)
        messages = [{"role": m.get("role"), "content": _content_text(m.get("content"))} for m in req.messages]
        check_prompt_size(sum(len(m["content"]) for m in messages if isinstance(m["content"], str)))
        if not model.info.chat_template:
            raise EdgerunError("this model has no chat template; use /v1/completions")
        prompt = await run_in_threadpool(templates.render, model.info.chat_template, messages,
                                         special=template_tokens(model.info, model.tokenizer) if model.tokenizer
                                         else {})
        prepared, constraint = await run_in_threadpool(prepare, req, prompt)
        job, events = submit(prepared, constraint)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            def chunk(piece: str | None, finish: str | None) -> dict[str, Any]:
                delta = {"role": "assistant", "content": ""} if piece is None and finish is None else \
                    ({"content": piece} if piece else {})
                return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model_id,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return StreamingResponse(_sse(job, events, chunk, chunk(None, None), _wants_usage(req)),
                                     media_type="text/event-stream")
        result = await _collect(job, events, request)
        if result is None:
            return Response(status_code=499)
        return {"id": ident, "object": "chat.completion", "created": created, "model": model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                             "finish_reason": result.finish_reason}], "usage": _usage(result)}

    @app.post("/v1/embeddings", response_model=None)
    async def embeddings(req: EmbeddingRequest) -> Any:
        if embedder is None:
            raise ApiError(404, "this server serves no embedding model (edgerun llm serve --embedding-program)",
                           code="model_not_found")
        if req.model is not None and req.model != embedder.name:
            raise ApiError(404, f"embedding model {req.model!r} is not served here (this server has "
                                f"{embedder.name!r})", code="model_not_found")
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts or any(not t for t in texts):
            raise EdgerunError("input must be a non-empty string or a non-empty list of non-empty strings")
        if len(texts) > config.max_embedding_inputs:
            raise EdgerunError(f"input may hold at most {config.max_embedding_inputs} strings, got {len(texts)}")
        check_prompt_size(sum(len(t) for t in texts))
        if req.encoding_format not in ("float", "base64"):
            raise EdgerunError(f"encoding_format must be float or base64, got {req.encoding_format!r}")
        vectors, tokens = await run_in_threadpool(embedder.embed, texts)
        if req.dimensions is not None and req.dimensions != vectors.shape[1]:
            raise EdgerunError(f"dimensions: this model's embeddings have {vectors.shape[1]}, not {req.dimensions}")
        return {"object": "list", "model": embedder.name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "data": [{"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
                         for i, v in enumerate(vectors)]}

    return app


def _content_text(content: Any) -> Any:
    """OpenAI allows content as a list of parts; text parts are joined, other kinds refused."""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise EdgerunError("only text content parts are supported")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    return content


def _usage(result: GenerationResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": len(result.token_ids),
            "total_tokens": result.prompt_tokens + len(result.token_ids)}


def _wants_usage(req: _Sampling) -> bool:
    return bool((req.stream_options or {}).get("include_usage"))


async def _collect(job: Job, events: asyncio.Queue, request: Request) -> GenerationResult | None:
    """The request's result, or None when its client left first (then the job is cancelled: the engine stops
    it before its next step). The client's leaving shows as `http.disconnect` on the ASGI receive channel,
    which has nothing else to say once the body has been read."""
    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()
        events.put_nowait(("cancelled", None))

    watcher = asyncio.create_task(watch())
    try:
        while True:
            kind, value = await events.get()
            if kind == "done":
                result: GenerationResult = value
                return result
            if kind == "error":
                raise value if isinstance(value, EdgerunError) else \
                    ApiError(500, f"generation failed: {value}", "server_error")
            if kind == "cancelled":
                return None
    finally:
        watcher.cancel()
        job.cancel()  # a no-op once done; stops the job if this handler itself was cancelled


async def _sse(job: Job, events: asyncio.Queue, chunk: Callable[[str | None, str | None], dict[str, Any]],
               first: dict[str, Any] | None, include_usage: bool = False) -> AsyncIterator[bytes]:
    """Forward the job's text pieces as server-sent events.

    With `include_usage` (OpenAI's `stream_options`), every chunk carries `"usage": null` and one more chunk,
    with no choices, carries the usage before `[DONE]`. When the client leaves, Starlette cancels this
    generator (it listens for `http.disconnect` while streaming) and the `finally` cancels the job.
    """
    def event(payload: dict[str, Any]) -> bytes:
        return _event({**payload, "usage": None} if include_usage else payload)

    try:
        if first is not None:
            yield event(first)
        while True:
            kind, value = await events.get()
            if kind == "text":
                yield event(chunk(value, None))
            elif kind == "done":
                yield event(chunk("", value.finish_reason))
                if include_usage:
                    yield _event({**chunk(None, None), "choices": [], "usage": _usage(value)})
                break
            elif kind == "error":
                yield _event({"error": {"message": str(value), "type": "invalid_request_error" if
                                        isinstance(value, EdgerunError) else "server_error", "param": None,
                                        "code": None}})
                break
            else:
                return
        yield b"data: [DONE]\n\n"
    finally:
        job.cancel()


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def serve(model: LanguageModel, host: str = "127.0.0.1", port: int = 8000, config: ServerConfig | None = None,
          embedder: Embedder | None = None) -> None:
    import uvicorn

    uvicorn.run(create_app(model, config, embedder=embedder), host=host, port=port, log_level="info")
