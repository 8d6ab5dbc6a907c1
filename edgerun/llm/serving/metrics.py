"""The server's Prometheus metrics (prometheus_client, the reference client library), one registry per app so
that several servers in one process (tests) keep separate counts.

Tokens per second is the rate of `edgerun_llm_generated_tokens_total` (PromQL `rate(...[1m])`), and the last
request's decode speed is a gauge as well, for a scraper that does not compute rates.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.generated_tokens = Counter("edgerun_llm_generated_tokens", "New tokens generated", registry=r)
        self.prompt_tokens = Counter("edgerun_llm_prompt_tokens", "Prompt tokens run through prefill", registry=r)
        self.decode_tokens_per_second = Gauge("edgerun_llm_decode_tokens_per_second",
                                              "Decode speed of the last finished request", registry=r)
        self.queue_depth = Gauge("edgerun_llm_queue_depth", "Requests admitted and waiting to start", registry=r)
        self.batch_size = Gauge("edgerun_llm_batch_size", "Sequences in the running model call", registry=r)
        self.time_to_first_token = Histogram("edgerun_llm_time_to_first_token_seconds",
                                             "From admission to the first new token", buckets=TTFT_BUCKETS,
                                             registry=r)
        self.model_steps = Counter("edgerun_llm_model_steps", "Model calls (a prefill chunk or a decode step)",
                                   registry=r)
        self.prefix_cache_hits = Counter("edgerun_llm_prefix_cache_hits", "Prompts that restored saved KV rows",
                                         registry=r)
        self.prefix_cache_tokens = Counter("edgerun_llm_prefix_cache_tokens",
                                           "Prompt tokens whose KV rows were restored, not computed", registry=r)
        self.prefix_cache_bytes = Gauge("edgerun_llm_prefix_cache_bytes", "Host memory the saved KV rows take",
                                        registry=r)
        self.requests = Counter("edgerun_llm_requests", "Finished or refused requests by outcome",
                                ["outcome"], registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
