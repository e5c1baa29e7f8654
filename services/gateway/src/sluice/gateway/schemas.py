"""Request bodies of the OpenAI API as the gateway accepts them.

Unknown fields are ignored (clients send many); known fields are checked
and a failure names the field. vLLM's extensions that benchmark clients
send (ignore_eos, top_k, min_tokens, continuous_usage_stats) are accepted.
"""

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request

from sluice.gateway.errors import ApiError
from sluice.outcomes import Reason


BodyT = TypeVar("BodyT", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessageIn(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


# Token counts travel as uint32 on the wire; anything larger is nonsense.
MAX_TOKEN_COUNT = 2**32 - 1


class SamplingFields(_Body):
    model: str = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKEN_COUNT)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOKEN_COUNT)] | None = None  # -1 and 0 both mean off (vLLM uses -1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    service_tier: Literal["auto", "default", "flex"] | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT)] = 0

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        if isinstance(stop, list) and any(not s for s in stop) or stop == "":
            raise ValueError("stop sequences must not be empty")
        return stop

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def output_limit(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKEN_COUNT)] | None = None

    def output_limit(self) -> int | None:
        # max_completion_tokens is the newer name; it wins when both are sent.
        return self.max_completion_tokens or self.max_tokens

    def prompt_chars(self) -> int:
        return sum(len(m.text()) for m in self.messages)


class CompletionRequest(SamplingFields):
    prompt: str = Field(min_length=1)

    def prompt_chars(self) -> int:
        return len(self.prompt)


async def read_json_body(request: Request, max_body_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise ApiError.of(Reason.REQUEST_TOO_LARGE, f"Request body is over the {max_body_bytes}-byte limit.")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_body_bytes:
            raise ApiError.of(Reason.REQUEST_TOO_LARGE, f"Request body is over the {max_body_bytes}-byte limit.")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError.of(Reason.INVALID_JSON, f"The request body is not valid JSON: {error}") from error


def parse_body(model: type[BodyT], document: Any) -> BodyT:
    if not isinstance(document, dict):
        raise ApiError.of(Reason.INVALID_REQUEST, "The request body must be a JSON object.")
    try:
        return model.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        raise ApiError.of(Reason.INVALID_REQUEST, f"Invalid value for '{param}': {message}", param=param) from None
