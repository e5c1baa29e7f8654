"""Server-sent events framing."""

import json
from dataclasses import dataclass
from typing import Any

DONE = b"data: [DONE]\n\n"

# Stands for the text in a chunk encoded once: no text can encode to it,
# since the JSON encoder escapes NUL.
TEXT_SLOT = "\x00text\x00"


class LastFrame(bytes):
    """A stream's last bytes: the response ends the body with them, in the
    same write."""


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json_bytes(payload) + b"\n\n"


def comment(text: str = "keep-alive") -> bytes:
    return f": {text}\n\n".encode()


@dataclass(frozen=True, slots=True)
class ContentFrames:
    """One stream's content events as bytes around the text. Everything but
    the text (id, created, model, fingerprint, choice) is the same on every
    token of a stream, so it is encoded once and a token costs one string
    encode instead of a dict and a whole-payload dump:

        data: {"id":"chatcmpl-..",...,"delta":{"content":  "text"  },"logprobs":null,...}\\n\\n
        `----------------------- prefix ---------------------´        `------- suffix -------´
    """

    prefix: bytes
    suffix: bytes

    @classmethod
    def around(cls, payload: dict[str, Any]) -> "ContentFrames":
        """`payload`: a chunk whose one string value TEXT_SLOT marks the text."""
        prefix, suffix = event(payload).split(json_bytes(TEXT_SLOT))
        return cls(prefix, suffix)

    def frame(self, text: str) -> bytes:
        return self.prefix + json_bytes(text) + self.suffix
