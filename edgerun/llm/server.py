"""`edgerun llm serve`: an OpenAI-compatible HTTP server (FastAPI) for one loaded model.

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (both with `stream: true` over
server-sent events; `stream_options: {"include_usage": true}` adds the usage chunk). The model has one KV
cache, so requests run one at a time in arrival order (the model's lock is the queue; FastAPI's worker
threads wait on it) and are never interleaved. Bad input gets OpenAI's error JSON (`{"error": {"message",
"type", "param", "code"}}`) with status 400, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from edgerun.errors import EdgerunError
from edgerun.llm.generation import GenerationResult
from edgerun.llm.model import LanguageModel


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


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def create_app(model: LanguageModel, default_max_tokens: int = 256) -> FastAPI:
    app = FastAPI(title="edgerun llm", version="1")
    model_id = model.name

    @app.exception_handler(EdgerunError)
    async def _edgerun_error(request: Request, exc: EdgerunError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"invalid request: {where}: {first.get('msg', exc)}")

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "edgerun"}]}

    def generation_args(req: _Sampling) -> dict[str, Any]:
        if req.model not in (None, model_id):
            raise _NotFound(f"model {req.model!r} is not served here (this server has {model_id!r})")
        if req.n != 1:
            raise EdgerunError("n must be 1")
        if req.stream_options is not None and not req.stream:
            raise EdgerunError("stream_options is only allowed when stream is true")
        max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
        return {"max_new_tokens": max_tokens, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
                "min_p": req.min_p, "repetition_penalty": req.repetition_penalty, "seed": req.seed,
                "stop": req.stop}

    @app.exception_handler(_NotFound)
    async def _not_found(request: Request, exc: _NotFound) -> JSONResponse:
        return _error(404, str(exc), code="model_not_found")

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Any:
        args = generation_args(req)
        prompt: Any = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise EdgerunError("one prompt per request")
            prompt = prompt[0]
        model.prepare(prompt, **args)  # bad input fails here, before a stream starts

        def run(on_text: Any) -> GenerationResult:
            return model.generate(prompt, on_text=on_text, **args)
        ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            def chunk(piece: str | None, finish: str | None) -> dict[str, Any]:
                return {"id": ident, "object": "text_completion", "created": created, "model": model_id,
                        "choices": [{"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}]}
            return StreamingResponse(_sse(run, chunk, None, _wants_usage(req)), media_type="text/event-stream")
        result = await run_in_threadpool(run, None)
        return {"id": ident, "object": "text_completion", "created": created, "model": model_id,
                "choices": [{"index": 0, "text": result.text, "logprobs": None,
                             "finish_reason": result.finish_reason}], "usage": _usage(result)}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatRequest) -> Any:
        args = generation_args(req)
        messages = [{"role": m.get("role"), "content": _content_text(m.get("content"))} for m in req.messages]
        prompt = model.apply_chat_template(messages)
        chat_args = model.chat_kwargs(args)
        model.prepare(prompt, **chat_args)  # bad input fails here, before a stream starts

        def run(on_text: Any) -> GenerationResult:
            return model.generate(prompt, on_text=on_text, **chat_args)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            def chunk(piece: str | None, finish: str | None) -> dict[str, Any]:
                delta = {"role": "assistant", "content": ""} if piece is None and finish is None else \
                    ({"content": piece} if piece else {})
                return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model_id,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return StreamingResponse(_sse(run, chunk, chunk(None, None), _wants_usage(req)),
                                     media_type="text/event-stream")
        result = await run_in_threadpool(run, None)
        return {"id": ident, "object": "chat.completion", "created": created, "model": model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                             "finish_reason": result.finish_reason}], "usage": _usage(result)}

    return app


class _NotFound(EdgerunError):
    pass


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


async def _sse(run: Callable[[Any], GenerationResult], chunk: Callable[[str | None, str | None], dict[str, Any]],
               first: dict[str, Any] | None, include_usage: bool = False) -> AsyncIterator[bytes]:
    """Run the generation in a thread and forward its text pieces as server-sent events.

    With `include_usage` (OpenAI's `stream_options`), every chunk carries `"usage": null` and one more chunk,
    with no choices, carries the usage before `[DONE]`.
    """
    def event(payload: dict[str, Any]) -> bytes:
        return _event({**payload, "usage": None} if include_usage else payload)

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def work() -> None:
        try:
            result = run(lambda piece: loop.call_soon_threadsafe(queue.put_nowait, ("text", piece)))
            loop.call_soon_threadsafe(queue.put_nowait, ("done", result))
        except Exception as exc:  # reported in the stream: the status line has already gone out
            loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))

    threading.Thread(target=work, daemon=True).start()
    if first is not None:
        yield event(first)
    while True:
        kind, value = await queue.get()
        if kind == "text":
            yield event(chunk(value, None))
        elif kind == "done":
            yield event(chunk("", value.finish_reason))
            if include_usage:
                yield _event({**chunk(None, None), "choices": [], "usage": _usage(value)})
            break
        else:
            yield _event({"error": {"message": str(value), "type": "invalid_request_error" if
                                    isinstance(value, EdgerunError) else "server_error", "param": None, "code": None}})
            break
    yield b"data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def serve(model: LanguageModel, host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn

    uvicorn.run(create_app(model), host=host, port=port, log_level="info")
