"""The parts of `edgerun llm serve` around the HTTP routes (edgerun/llm/server.py).

- `config.py`: the server's limits and options (`ServerConfig`), one place for every bound.
- `api_error.py`: OpenAI's error form (`{"error": {"message", "type", "param", "code"}}`) as an exception.
- `guard.py`: ASGI middleware that checks the API key and the body size before a route reads the body.
- `template_pool.py`, `template_worker.py`: chat templates rendered in worker processes with a time and a
  memory bound, so a hostile template cannot freeze the event loop or exhaust the server's memory.
- `engine.py`: the thread that runs generations a model step at a time, so a request whose client left stops
  within one step; the bounded queue and the token caps.
- `constraint.py`: structured output (`response_format`, grammars, regexes) through llguidance.
- `metrics.py`: the Prometheus metrics behind `/metrics`.
- `embeddings.py`: `/v1/embeddings` from an encoder program.
"""
