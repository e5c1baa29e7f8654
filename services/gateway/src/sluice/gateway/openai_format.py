"""Response and chunk shapes, exactly as OpenAI's API returns them.

One `ResponseFormat` per endpoint: chat completions carry `message` /
`delta`, legacy completions carry `text`. `system_fingerprint` is the model
version that served the request.
"""

import time
from dataclasses import dataclass
from typing import Any

from sluice.gateway.sse import TEXT_SLOT, ContentFrames
from sluice.v1 import common_pb2

FINISH_REASONS = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
}


def usage_body(usage: common_pb2.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.prompt_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    response_id: str
    model: str
    model_version: str
    chat: bool
    created_unix_s: int

    @classmethod
    def for_request(cls, request_id: str, model: str, model_version: str, chat: bool) -> "ResponseFormat":
        prefix = "chatcmpl-" if chat else "cmpl-"
        return cls(prefix + request_id, model, model_version, chat, int(time.time()))

    def _envelope(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created_unix_s,
            "model": self.model,
            "system_fingerprint": self.model_version,
        }

    def chunk(self, text: str | None, finish_reason: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._envelope("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._envelope("text_completion"), "choices": [choice]}

    def content_frames(self) -> ContentFrames:
        """This response's per-token content chunks as SSE frames, the
        envelope encoded once (``frames.frame(text)`` is byte for byte
        ``sse.event(self.chunk(text, None))``)."""
        return ContentFrames.around(self.chunk(TEXT_SLOT, None))

    def usage_chunk(self, usage: common_pb2.Usage) -> dict[str, Any]:
        name = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._envelope(name), "choices": [], "usage": usage_body(usage)}

    def full_response(self, text: str, finish_reason: str, usage: common_pb2.Usage) -> dict[str, Any]:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            envelope = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            envelope = self._envelope("text_completion")
        return {**envelope, "choices": [choice], "usage": usage_body(usage)}
