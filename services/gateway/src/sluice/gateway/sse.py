"""Server-sent events framing."""

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def comment(text: str = "keep-alive") -> bytes:
    return f": {text}\n\n".encode()
