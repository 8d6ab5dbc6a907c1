"""Render a model's chat template (Jinja2) the way transformers' apply_chat_template does.

transformers compiles the template in a sandboxed environment with trim_blocks and lstrip_blocks, adds a
`tojson` filter and the `raise_exception` and `strftime_now` globals, and passes the messages, the special
tokens and `add_generation_prompt`.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from edgerun.errors import EdgerunError

ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise EdgerunError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise EdgerunError(f"message {i} must be a dict with string 'role' and 'content', got {m!r}")
        if m["role"] not in ROLES:
            raise EdgerunError(f"message {i} has role {m['role']!r}; roles are {', '.join(ROLES)}")
        out.append(dict(m))
    return out


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise EdgerunError(f"chat template: {message}")

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise EdgerunError(f"the model's chat template does not compile: {exc}") from None


def render_chat(template: str | None, messages: Any, *, add_generation_prompt: bool = True,
                special_tokens: dict[str, str] | None = None) -> str:
    if not template:
        raise EdgerunError("this model has no chat template; use generate() with a plain prompt")
    messages = check_messages(messages)
    return str(_compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **(special_tokens or {})))
