"""The generation engine: one thread runs admitted requests a model step at a time.

A step is one model call: a prefill chunk or one decode step. Before every step the engine looks at the request's
cancel flag, so a request whose client left stops within one step and a request cancelled while it waited
never runs. The model has one KV cache, so requests run one after another, first come first served; the
cache keeps the whole chunks of prefix a request shares with the one before it (StepRunner.run_prompt), and
the prefix cache (prefix_cache.py) brings back those of earlier requests.

Admission is bounded: past `max_queue` waiting requests `submit` raises the 429 error, past
`max_pending_tokens` new tokens reserved by the admitted requests the 503 error (both OpenAI's form). A
request's first token therefore waits for at most the requests ahead of it, each at most
ceil(context / chunk) + 1 prefill calls and its max_tokens decode steps.

The token stream and the end of a request reach the caller through its `emit(kind, value)` callback, called
on this thread: ("text", piece), then exactly one of ("done", GenerationResult), ("error", exception) or
("cancelled", None).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edgerun.llm.generation import GenerationResult, held_back, stop_cut
from edgerun.llm.model import GenerationRequest, LanguageModel
from edgerun.llm.sampling import next_token
from edgerun.llm.serving.api_error import queue_full, token_budget
from edgerun.llm.serving.metrics import ServerMetrics
from edgerun.llm.serving.prefix_cache import PrefixCache

Emit = Callable[[str, Any], None]


class Constraint(Protocol):
    """What structured output needs from a step (constraint.py): the allowed tokens, then the chosen one."""

    def mask(self, logits: np.ndarray) -> np.ndarray: ...

    def consume(self, token: int) -> None: ...

    def finished(self) -> bool: ...


@dataclass(eq=False)
class Job:
    request: GenerationRequest
    emit: Emit
    constraint: Constraint | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    steps: int = 0  # model calls run for this request
    prompt_steps: int = 0  # of those, the prompt's (prefill chunks)
    outcome: str = "waiting"  # then "running", and "stop", "length", "cancelled" or "error"
    admitted_at: float = 0.0
    first_token_at: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()


class Engine:
    def __init__(self, model: LanguageModel, metrics: ServerMetrics, *, max_queue: int,
                 max_pending_tokens: int | None, prefix_cache_bytes: int = 0,
                 step_gate: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        """`prefix_cache_bytes`: the budget of the prefix cache (0: none). `step_gate` is called on the engine
        thread before every model call (tests pace the engine with it); `clock` times the first token and the
        decode speed."""
        self.model, self.metrics = model, metrics
        self.prefix_cache = PrefixCache(model, prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.max_queue, self.max_pending_tokens = max_queue, max_pending_tokens
        self.step_gate, self.clock = step_gate, clock
        self.steps = 0  # model calls since start, all requests
        self.finished: collections.deque[Job] = collections.deque(maxlen=256)  # the last few, for inspection
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._pending_tokens = 0
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="edgerun-llm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            for job in self._waiting:
                job.cancel()
            if self._running is not None:
                self._running.cancel()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(30)

    def submit(self, job: Job) -> None:
        """Admit `job` or raise ApiError (429 queue full, 503 token budget spent)."""
        tokens = job.request.max_new_tokens
        with self._cv:
            if len(self._waiting) >= self.max_queue and self._running is not None:
                self.metrics.requests.labels("rejected").inc()
                raise queue_full(self.max_queue)
            if self.max_pending_tokens is not None and self._pending_tokens + tokens > self.max_pending_tokens:
                self.metrics.requests.labels("rejected").inc()
                raise token_budget(self.max_pending_tokens)
            self._pending_tokens += tokens
            job.admitted_at = self.clock()
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._cv.notify_all()

    def admitted(self) -> list[Job]:
        """The running request (first) and the waiting ones, in order."""
        with self._cv:
            return ([self._running] if self._running is not None else []) + list(self._waiting)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    for job in self._waiting:
                        self._finish(job, "cancelled")
                    self._waiting.clear()
                    return
                job = self._waiting.popleft()
                self._running = job
                self.metrics.queue_depth.set(len(self._waiting))
            try:
                outcome = self._run(job)
            except Exception as exc:  # the request's error (bad state, a backend failure): reported, not fatal
                job.emit("error", exc)
                outcome = "error"
            with self._cv:
                self._running = None
                self._finish(job, outcome)

    def _finish(self, job: Job, outcome: str) -> None:
        if outcome == "cancelled":
            job.emit("cancelled", None)
        job.outcome = outcome
        self._pending_tokens -= job.request.max_new_tokens
        self.metrics.requests.labels(outcome).inc()
        self.finished.append(job)

    def _step(self, job: Job) -> bool:
        """Wait for the gate, then say whether the request may make one more model call (and count it)."""
        if self.step_gate is not None:
            self.step_gate()
        if job.cancelled.is_set():
            return False
        self.steps += 1
        job.steps += 1
        self.metrics.model_steps.inc()
        return True

    def _run(self, job: Job) -> str:
        if job.cancelled.is_set():
            return "cancelled"
        job.outcome = "running"
        with self.model._lock:  # the model's own generate() and reset() take it too: one user of the cache
            self.metrics.batch_size.set(1)
            try:
                return self._generate(job)
            finally:
                self.metrics.batch_size.set(0)

    def _generate(self, job: Job) -> str:
        """The generation loop of generation.run_generation, a model call at a time with the cancel check
        before each, and the request's constraint applied to the logits."""
        req, runner, tokenizer = job.request, self.model.runner, self.model.tokenizer
        rng = np.random.default_rng(req.params.seed)
        prefill_start = self.clock()
        logits: np.ndarray | None = None
        if self.prefix_cache is not None:
            restored = self.prefix_cache.restore(req.prompt_ids)
            if restored:
                self.metrics.prefix_cache_hits.inc()
                self.metrics.prefix_cache_tokens.inc(restored)
        kept = len(req.prompt_ids) - len(runner.reuse_prefix(req.prompt_ids))
        for end in prompt_steps(len(req.prompt_ids), kept, runner.chunk):
            if not self._step(job):
                return "cancelled"
            # The prompt up to `end` as StepRunner.run_prompt runs a whole prompt: its kept whole chunks
            # reused, the rest through prefill. So these calls together are exactly run_prompt(prompt_ids).
            logits = runner.run_prompt(req.prompt_ids[:end])
            job.prompt_steps += 1
        assert logits is not None
        if self.prefix_cache is not None:
            self.prefix_cache.save(req.prompt_ids)
            self.metrics.prefix_cache_bytes.set(self.prefix_cache.bytes)
        self.metrics.prompt_tokens.inc(len(req.prompt_ids))
        prefill_s = self.clock() - prefill_start
        generated: list[int] = []
        raw, text, emitted, finish = bytearray(), "", 0, "length"
        decode_start = self.clock()
        for step in range(req.max_new_tokens):
            if job.constraint is not None:
                logits = job.constraint.mask(logits)
            token = next_token(logits, req.params, req.prompt_ids + generated, rng)
            if token in req.stop_token_ids:
                finish = "stop"
                break
            if job.constraint is not None:
                job.constraint.consume(token)
            generated.append(token)
            self.metrics.generated_tokens.inc()
            if job.first_token_at is None:
                job.first_token_at = self.clock()
                self.metrics.time_to_first_token.observe(job.first_token_at - job.admitted_at)
            cut = None
            if tokenizer is not None:
                raw += tokenizer.decode_bytes([token])
                text = raw.decode("utf-8", errors="replace")
                cut = stop_cut(text, req.stop) if req.stop else None
                if cut is not None:
                    text, finish = text[:cut], "stop"
                # Hold back a half-decoded character (U+FFFD at the end) and a possible stop-string start.
                ready = len(text) if cut is not None else len(text.rstrip("\ufffd")) - held_back(text, req.stop)
                if ready > emitted:
                    job.emit("text", text[emitted:ready])
                    emitted = ready
            if cut is not None:
                break
            if job.constraint is not None and job.constraint.finished():
                finish = "stop"
                break
            if step + 1 < req.max_new_tokens:
                if not self._step(job):
                    return "cancelled"
                logits = runner.forward([token])
        decode_s = self.clock() - decode_start
        if len(text) > emitted:
            job.emit("text", text[emitted:])
        result = GenerationResult(generated, text, len(req.prompt_ids), finish, prefill_s, decode_s)
        if result.decode_tokens_per_second:
            self.metrics.decode_tokens_per_second.set(result.decode_tokens_per_second)
        job.emit("done", result)
        return finish


def prompt_steps(length: int, kept: int, chunk: int) -> list[int]:
    """Where each prefill call of a prompt ends: a chunk at a time after the `kept` cached tokens (a whole
    number of chunks), the last call ending at the prompt's end."""
    return [*range(kept + chunk, length, chunk), length]
