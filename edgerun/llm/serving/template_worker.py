"""A chat-template worker process: `python -m edgerun.llm.serving.template_worker MEMORY_BYTES MAX_CHARS`.

Reads one JSON request a line on stdin ({"template", "messages", "add_generation_prompt", "special"}) and
writes one JSON line back: {"text": ...} or {"error": ...}. Its address space is capped (RLIMIT_AS) after the
imports, so a template that builds a huge string fails with MemoryError here, not in the server; the server
kills the process when a render passes its time bound (template_pool.py).
"""

from __future__ import annotations

import json
import resource
import sys
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.llm.chat_template import render_chat


def main(memory_bytes: int, max_chars: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        reply: dict[str, Any]
        try:
            request = json.loads(line)
            text = render_chat(request["template"], request["messages"],
                               add_generation_prompt=request["add_generation_prompt"],
                               special_tokens=request["special"])
            reply = {"text": text} if len(text) <= max_chars else \
                {"error": f"the chat template's output is longer than the limit of {max_chars} characters"}
        except MemoryError:
            reply = {"error": "the chat template ran out of its memory bound", "fatal": True}
        except EdgerunError as exc:
            reply = {"error": str(exc)}
        except Exception as exc:  # a template error of any kind is the request's error, not the server's
            reply = {"error": f"the chat template failed: {type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if reply.get("fatal"):
            return


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
