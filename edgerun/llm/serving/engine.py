"""The generation engine: one thread runs the admitted requests together, with continuous batching.

A model loaded with `slots=B` (model.py, `--batch-size`) decodes up to B sequences in one call
(slot_batch.py). The engine's loop repeats one *iteration*: up to `prefill_chunks` prefill calls of
newcomers' prompts (the request at the head of the queue, once a slot is free for it; when its prompt is
done and a slot is still free, the next one), then one decode step for every running request together. A
request joins the running batch when its prompt's last chunk is done (its cache copied into its slot) and
leaves it at the step it ends (stop, length, cancel): its slot is free for the next newcomer. A newcomer's
prompt runs in chunks (`prefill`, into the single-sequence cache, where StepRunner reuses a shared prefix and
the prefix cache restores earlier ones), so newcomers are prefilled one after another and the running
requests keep decoding between the budgets: several prefill calls an iteration fill an empty batch in fewer
decode steps (each step runs all B slots, so a step with few sequences costs nearly what a full one does),
at the price of a longer pause between the running requests' tokens. With one slot (a model loaded without
`slots`) the single-sequence cache is the slot: requests run one after another.

Model calls (a prefill chunk, a decode step) are the engine's steps: before each the gate is called (tests
pace the engine with it) and each request's cancel flag is looked at, so a request whose client left stops
within one step and leaves its slot, and a request cancelled while it waited never runs.

Admission is bounded: past `max_queue` waiting requests `submit` raises the 429 error, past
`max_pending_tokens` new tokens reserved by the admitted requests the 503 error (both OpenAI's form).

Fairness (first come first served, bounded): requests start in the order they were admitted. A request at
the head of the queue starts its prefill as soon as a slot is free; a slot frees whenever a running request
ends, so within `--max-tokens-limit` decode steps. From then on its first token takes ceil(P / chunk)
prefill calls for a P-token prompt (less what the caches restore), up to `prefill_chunks` of them between
two decode steps, whatever the running requests still have to generate: a long request delays others' first
tokens only by the one decode step per iteration it shares, never by its whole length, unless all B slots
are held. A running request waits at most `prefill_chunks` prefill calls between two of its tokens.

The token stream and the end of a request reach the caller through its `emit(kind, value)` callback, called
on this thread: ("text", piece), then exactly one of ("done", GenerationResult), ("error", exception) or
("cancelled", None).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edgerun.llm.generation import GenerationResult, held_back, stop_cut
from edgerun.llm.model import GenerationRequest, LanguageModel
from edgerun.llm.sampling import next_token
from edgerun.llm.serving.api_error import queue_full, token_budget
from edgerun.llm.serving.metrics import ServerMetrics
from edgerun.llm.serving.prefix_cache import PrefixCache
from edgerun.llm.slot_batch import SlotBatch
from edgerun.llm.step_runner import StepRunner

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
    steps: int = 0  # model calls this request took part in
    prompt_steps: int = 0  # of those, the prompt's (prefill chunks)
    largest_batch: int = 0  # the most sequences in one of its decode calls
    joined_at: int | None = None  # the engine's step count when it joined the running batch
    left_at: int | None = None  # ... and when it ended
    outcome: str = "waiting"  # then "running", and "stop", "length", "cancelled" or "error"
    admitted_at: float = 0.0
    first_token_at: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()


class Decoder(Protocol):
    """Where running sequences decode: the batched decode's slots, or the single-sequence cache."""

    def admit(self, slot: int, position: int) -> None: ...

    def release(self, slot: int) -> None: ...

    def step(self, tokens: Mapping[int, int]) -> dict[int, np.ndarray]: ...


class SingleSlot:
    """One slot that is the single-sequence cache itself (a model without a batched decode)."""

    def __init__(self, runner: StepRunner) -> None:
        self.runner = runner

    def admit(self, slot: int, position: int) -> None:
        pass  # the prompt is already where decoding reads it

    def release(self, slot: int) -> None:
        pass

    def step(self, tokens: Mapping[int, int]) -> dict[int, np.ndarray]:
        return {slot: self.runner.forward([token]) for slot, token in tokens.items()}


class Sequence:
    """An admitted request's generation state, advanced one token at a time (generation.run_generation's loop,
    split at the model calls)."""

    def __init__(self, job: Job, engine: Engine) -> None:
        self.job, self.engine = job, engine
        req = job.request
        self.rng = np.random.default_rng(req.params.seed)
        self.generated: list[int] = []
        self.raw, self.text, self.emitted, self.finish = bytearray(), "", 0, "length"
        self.slot = -1
        self.prompt_ends: list[int] = []  # where each remaining prefill call ends
        self.prefill_start = engine.clock()
        self.decode_start = 0.0
        self.next: int | None = None  # the token to decode next

    def accept(self, logits: np.ndarray) -> bool:
        """Sample a token from `logits` and stream its text; False when the request has ended."""
        req, job, metrics, tokenizer = self.job.request, self.job, self.engine.metrics, self.engine.model.tokenizer
        if job.constraint is not None:
            logits = job.constraint.mask(logits)
        token = next_token(logits, req.params, req.prompt_ids + self.generated, self.rng)
        if token in req.stop_token_ids:
            self.finish = "stop"
            return False
        if job.constraint is not None:
            job.constraint.consume(token)
        self.generated.append(token)
        metrics.generated_tokens.inc()
        if job.first_token_at is None:
            job.first_token_at = self.engine.clock()
            metrics.time_to_first_token.observe(job.first_token_at - job.admitted_at)
        cut = None
        if tokenizer is not None:
            self.raw += tokenizer.decode_bytes([token])
            text = self.raw.decode("utf-8", errors="replace")
            cut = stop_cut(text, req.stop) if req.stop else None
            if cut is not None:
                text, self.finish = text[:cut], "stop"
            # Hold back a half-decoded character (U+FFFD at the end) and a possible stop-string start.
            ready = len(text) if cut is not None else len(text.rstrip("\ufffd")) - held_back(text, req.stop)
            if ready > self.emitted:
                job.emit("text", text[self.emitted:ready])
                self.emitted = ready
            self.text = text
        if cut is not None:
            return False
        if job.constraint is not None and job.constraint.finished():
            self.finish = "stop"
            return False
        if len(self.generated) == req.max_new_tokens:
            return False
        self.next = token
        return True

    def result(self) -> GenerationResult:
        if len(self.text) > self.emitted:
            self.job.emit("text", self.text[self.emitted:])
        now = self.engine.clock()
        decode_s = now - self.decode_start if self.decode_start else 0.0
        return GenerationResult(self.generated, self.text, len(self.job.request.prompt_ids), self.finish,
                                self.decode_start - self.prefill_start if self.decode_start else 0.0, decode_s)


class Engine:
    def __init__(self, model: LanguageModel, metrics: ServerMetrics, *, max_queue: int,
                 max_pending_tokens: int | None, prefill_chunks: int, prefix_cache_bytes: int = 0,
                 step_gate: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        """`prefix_cache_bytes`: the budget of the prefix cache (0: none). `prefill_chunks`: prefill calls at
        most between two decode steps (module doc). `step_gate` is called on the engine
        thread before every model call (tests pace the engine with it); `clock` times the first token and the
        decode speed. The batch size is the model's `slots`."""
        self.model, self.metrics = model, metrics
        self.slots = model.slots
        self.decoder: Decoder = SlotBatch(model.program, slots=model.slots, context=model.context) \
            if model.slots > 1 else SingleSlot(model.runner)
        self.prefix_cache = PrefixCache(model, prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.max_queue, self.max_pending_tokens = max_queue, max_pending_tokens
        if prefill_chunks < 1:
            raise ValueError(f"prefill_chunks must be >= 1, got {prefill_chunks}")
        self.prefill_chunks = prefill_chunks
        self.step_gate, self.clock = step_gate, clock
        self.steps = 0  # model calls since start, all requests
        self.finished: collections.deque[Job] = collections.deque(maxlen=256)  # the last few, for inspection
        self._waiting: collections.deque[Job] = collections.deque()
        self._prefilling: Sequence | None = None  # the newcomer whose prompt is running, chunk by chunk
        self._running: list[Sequence] = []  # decoding, each in its own slot
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
            for job in self.admitted():
                job.cancel()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(30)

    def submit(self, job: Job) -> None:
        """Admit `job` or raise ApiError (429 queue full, 503 token budget spent)."""
        tokens = job.request.max_new_tokens
        with self._cv:
            if len(self._waiting) >= self.max_queue and self._busy():
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
        """The running requests, the one being prefilled, then the waiting ones in order."""
        with self._cv:
            started = [s.job for s in self._running] + ([self._prefilling.job] if self._prefilling else [])
            return started + list(self._waiting)

    def _busy(self) -> bool:
        return bool(self._running) or self._prefilling is not None

    # -- the loop -----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        lock = self.model._lock  # the model's own generate() and reset() take it too: held while busy
        held = False
        while True:
            with self._cv:
                while not self._waiting and not self._busy() and not self._stopping:
                    if held:
                        lock.release()
                        held = False
                    self._cv.wait()
                if self._stopping:
                    self._stop_all()
                    if held:
                        lock.release()
                    return
            if not held:
                lock.acquire()
                held = True
            self._prefill_chunks()
            if self._running:
                self._decode_step()

    def _prefill_chunks(self) -> None:
        """Up to `prefill_chunks` prefill calls before the next decode step: the newcomer's, and once it has
        joined the batch the next waiting request's while a slot is free for it."""
        for _ in range(self.prefill_chunks):
            with self._cv:
                if self._prefilling is None and len(self._running) < self.slots and not self._stopping:
                    self._start_next()
                newcomer = self._prefilling
            if newcomer is None:
                return
            self._prefill_step(newcomer)

    def _start_next(self) -> None:
        """The first waiting request that is still wanted becomes the newcomer (called under the lock)."""
        while self._waiting:
            job = self._waiting.popleft()
            if job.cancelled.is_set():
                self._finish(job, "cancelled")
                continue
            job.outcome = "running"
            self._prefilling = Sequence(job, self)
            break
        self.metrics.queue_depth.set(len(self._waiting))

    def _stop_all(self) -> None:
        for job in self._waiting:
            self._finish(job, "cancelled")
        self._waiting.clear()
        for seq in [*self._running, *([self._prefilling] if self._prefilling else [])]:
            self._finish(seq.job, "cancelled")
        self._running, self._prefilling = [], None

    def _finish(self, job: Job, outcome: str) -> None:
        job.left_at = self.steps
        if outcome == "cancelled":
            job.emit("cancelled", None)
        job.outcome = outcome
        self._pending_tokens -= job.request.max_new_tokens
        self.metrics.requests.labels(outcome).inc()
        self.finished.append(job)

    def _end(self, seq: Sequence, outcome: str) -> None:
        """`seq` leaves: its slot is freed, its outcome recorded."""
        with self._cv:
            if seq in self._running:
                self._running.remove(seq)
                self.decoder.release(seq.slot)
            if seq is self._prefilling:
                self._prefilling = None
        if outcome not in ("cancelled", "error"):
            result = seq.result()
            if result.decode_tokens_per_second:
                self.metrics.decode_tokens_per_second.set(result.decode_tokens_per_second)
            seq.job.emit("done", result)
        with self._cv:
            self._finish(seq.job, outcome)
        self.metrics.batch_size.set(len(self._running))

    def _gate(self) -> None:
        if self.step_gate is not None:
            self.step_gate()

    def _leave_cancelled(self) -> None:
        """Running requests whose client left leave the batch (before the next model call)."""
        for seq in [s for s in self._running if s.job.cancelled.is_set()]:
            self._end(seq, "cancelled")

    def _count_step(self, jobs: list[Job]) -> None:
        self.steps += 1
        self.metrics.model_steps.inc()
        for job in jobs:
            job.steps += 1

    def _prefill_step(self, seq: Sequence) -> None:
        """One prefill call of the newcomer's prompt; after its last, its first token and a slot in the batch."""
        req, runner = seq.job.request, self.model.runner
        self._gate()
        self._leave_cancelled()  # the running requests' clients too: their slots free before this call
        if seq.job.cancelled.is_set():
            self._end(seq, "cancelled")
            return
        try:
            if not seq.prompt_ends:  # its first call: what the caches hold decides where the chunks end
                if self.prefix_cache is not None:
                    restored = self.prefix_cache.restore(req.prompt_ids)
                    if restored:
                        self.metrics.prefix_cache_hits.inc()
                        self.metrics.prefix_cache_tokens.inc(restored)
                kept = len(req.prompt_ids) - len(runner.reuse_prefix(req.prompt_ids))
                seq.prompt_ends = prompt_steps(len(req.prompt_ids), kept, runner.chunk)
            self._count_step([seq.job])
            seq.job.prompt_steps += 1
            # The prompt up to this end as StepRunner.run_prompt runs a whole prompt: its kept whole chunks
            # reused, the rest through prefill. So these calls together are exactly run_prompt(prompt_ids).
            logits = runner.run_prompt(req.prompt_ids[:seq.prompt_ends.pop(0)])
            if seq.prompt_ends:
                return
            if self.prefix_cache is not None:
                self.prefix_cache.save(req.prompt_ids)
                self.metrics.prefix_cache_bytes.set(self.prefix_cache.bytes)
            self.metrics.prompt_tokens.inc(len(req.prompt_ids))
            seq.decode_start = self.clock()
            with self._cv:
                self._prefilling = None
            if not seq.accept(logits):
                self._end(seq, seq.finish)
                return
            used = {s.slot for s in self._running}
            seq.slot = next(i for i in range(self.slots) if i not in used)
            self.decoder.admit(seq.slot, len(req.prompt_ids))
            seq.job.joined_at = self.steps
            with self._cv:
                self._running.append(seq)
        except Exception as exc:  # the request's error (bad state, a backend failure): reported, not fatal
            seq.job.emit("error", exc)
            self._end(seq, "error")

    def _decode_step(self) -> None:
        """One decode call for every running request; each samples its next token or ends."""
        self._gate()
        self._leave_cancelled()
        batch = list(self._running)
        if not batch:
            return
        self._count_step([s.job for s in batch])
        self.metrics.batch_size.set(len(batch))
        try:
            rows = self.decoder.step({s.slot: s.next for s in batch if s.next is not None})
        except Exception as exc:  # a backend failure: every request in the call gets it
            for seq in batch:
                seq.job.emit("error", exc)
                self._end(seq, "error")
            return
        for seq in batch:
            seq.job.largest_batch = max(seq.job.largest_batch, len(batch))
            if not seq.accept(rows[seq.slot]):
                self._end(seq, seq.finish)


def prompt_steps(length: int, kept: int, chunk: int) -> list[int]:
    """Where each prefill call of a prompt ends: a chunk at a time after the `kept` cached tokens (a whole
    number of chunks), the last call ending at the prompt's end."""
    return [*range(kept + chunk, length, chunk), length]
