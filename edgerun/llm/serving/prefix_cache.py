"""A prefix cache: the KV-cache rows of earlier prompts kept in host memory, restored for a prompt that
starts the same way (a chat's next turn, a shared system prompt), LRU-evicted under a byte budget.

The model has one KV cache (program state), and StepRunner reuses only what it holds, the last request's
prefix: two clients taking turns evicted each other's conversation every time. Here, after each prompt's
prefill, its whole prefill chunks' rows are copied out (`save`); before a prompt runs, the longest saved
prefix of it (whole chunks) is written back into the state when it beats what the cache already holds
(`restore`), and the runner is told which tokens those rows are.

Only rows that StepRunner counts as exact are saved: rows written by prefill chunks aligned as a fresh run
writes them (see step_runner.py). So a restored prompt runs exactly the calls and reads exactly the bits of a
run without the cache, and its tokens are the same (tests/llm/test_server_prefix_cache.py).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from edgerun.llm.model import LanguageModel
from edgerun.llm.program_builder import cache_names


class PrefixCache:
    def __init__(self, model: LanguageModel, budget_bytes: int) -> None:
        self.model, self.budget = model, budget_bytes
        self.names = cache_names(model.config)
        state = model.program.state
        # The position axis of each cache state: the one as long as the context (heads layout: axis 2).
        self.axes = {}
        for name in self.names:
            axes = [a for a, d in enumerate(state[name].shape) if d == model.context]
            assert len(axes) == 1, (name, state[name].shape)
            self.axes[name] = axes[0]
        self.entries: collections.OrderedDict[tuple[int, ...], dict[str, np.ndarray]] = collections.OrderedDict()
        self.bytes = 0
        self.hits = self.restored_tokens = 0

    def _rows(self, array: np.ndarray, name: str, n: int) -> tuple[slice, ...]:
        return tuple(slice(0, n) if a == self.axes[name] else slice(None) for a in range(array.ndim))

    def restore(self, prompt: Sequence[int]) -> int:
        """Write the longest saved whole-chunk prefix of `prompt` into the cache when it is longer than what
        the runner would keep anyway; return the tokens restored (0: nothing done). Call with the model's
        lock held."""
        runner, chunk = self.model.runner, self.model.runner.chunk
        limit = (len(prompt) - 1) // chunk * chunk  # at least one prompt token is left to run
        held = min(_common(runner.tokens, prompt), runner.exact, limit) // chunk * chunk
        best, best_key = held, None
        for key in self.entries:
            n = min(_common(key, prompt), limit) // chunk * chunk
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0
        self.entries.move_to_end(best_key)
        saved = self.entries[best_key]
        state = self.model.program.state
        values = {}
        for name in self.names:
            value = np.array(state[name])  # a copy: set_state takes whole states
            value[self._rows(value, name, best)] = saved[name][self._rows(saved[name], name, best)]
            values[name] = value
        self.model.program.set_state(**values)
        runner.tokens, runner.exact = list(prompt[:best]), best
        self.hits += 1
        self.restored_tokens += best - held
        return best - held

    def save(self, prompt: Sequence[int]) -> None:
        """Keep the exact whole-chunk rows of the prompt just run (the model's lock held)."""
        runner, chunk = self.model.runner, self.model.runner.chunk
        n = min(runner.exact, _common(runner.tokens, prompt)) // chunk * chunk
        if n == 0:
            return
        key = tuple(prompt[:n])
        for other in list(self.entries):
            if other[:n] == key:  # already kept, as this prefix or a longer one
                self.entries.move_to_end(other)
                return
            if key[:len(other)] == other:  # this one extends it: it goes
                self._drop(other)
        state = self.model.program.state
        rows = {name: np.ascontiguousarray(state[name][self._rows(state[name], name, n)]) for name in self.names}
        size = sum(a.nbytes for a in rows.values())
        if size > self.budget:
            return
        while self.bytes + size > self.budget:
            self._drop(next(iter(self.entries)))
        self.entries[key] = rows
        self.bytes += size

    def _drop(self, key: tuple[int, ...]) -> None:
        self.bytes -= sum(a.nbytes for a in self.entries.pop(key).values())


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
