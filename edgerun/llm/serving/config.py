"""Every bound and option of the server in one place, with the defaults `edgerun llm serve` uses."""

from __future__ import annotations

from dataclasses import dataclass

from edgerun.errors import EdgerunError


@dataclass(frozen=True)
class ServerConfig:
    api_keys: frozenset[str] = frozenset()  # empty: no key needed; else `Authorization: Bearer <one of them>`
    aliases: tuple[str, ...] = ()  # more names `model` may give for the served model (its id always works)
    default_max_tokens: int = 256  # when a request gives no max_tokens (then also cut to the room left)
    max_tokens_limit: int | None = None  # per request; None: the model's context
    max_body_bytes: int = 1 << 20  # a request body past this is refused (413) before it is read
    max_prompt_chars: int = 200_000  # prompt or message text past this is refused before tokenisation
    max_stop: int = 16  # stop strings per request
    max_stop_chars: int = 256  # characters per stop string
    max_queue: int = 64  # requests waiting for a batch slot; past it 429
    max_pending_tokens: int | None = None  # new tokens reserved by all admitted requests; past it 503
    prefill_chunks: int = 4  # prefill calls of newcomers' prompts at most between two decode steps
    prefix_cache_bytes: int = 256 << 20  # KV rows of earlier prompts kept for reuse (0: no prefix cache)
    template_timeout_s: float = 2.0  # a chat template's rendering is stopped after this
    template_memory_bytes: int = 512 << 20  # the address space a template worker may use
    template_workers: int = 2  # processes rendering chat templates
    max_grammar_chars: int = 100_000  # a JSON schema, grammar or regex past this is refused
    max_embedding_inputs: int = 256  # strings per /v1/embeddings request

    def check(self) -> None:
        for name in ("default_max_tokens", "max_body_bytes", "max_prompt_chars", "max_stop_chars",
                     "template_memory_bytes", "template_workers", "max_grammar_chars", "max_embedding_inputs",
                     "prefill_chunks"):
            if getattr(self, name) < 1:
                raise EdgerunError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_stop", "max_queue", "prefix_cache_bytes"):
            if getattr(self, name) < 0:
                raise EdgerunError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_tokens_limit", "max_pending_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise EdgerunError(f"{name} must be >= 1, got {value}")
        if not self.template_timeout_s > 0:
            raise EdgerunError(f"template_timeout_s must be > 0, got {self.template_timeout_s}")
        if any(not k for k in self.api_keys):
            raise EdgerunError("an API key must not be empty")


def read_api_keys(path: str) -> frozenset[str]:
    """One key a line; blank lines and lines starting with '#' are skipped. A file with no key is an error
    (a server meant to be locked must not start open)."""
    try:
        with open(path, encoding="utf-8") as f:
            keys = {line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")}
    except OSError as exc:
        raise EdgerunError(f"cannot read the API key file {path}: {exc.strerror}") from None
    if not keys:
        raise EdgerunError(f"the API key file {path} holds no key")
    return frozenset(keys)
