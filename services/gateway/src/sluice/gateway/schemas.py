"""Request bodies of the OpenAI API as the gateway accepts them.

Unknown fields are ignored (clients send many); known fields are checked
and a failure names the field. vLLM's extensions that benchmark clients
send (ignore_eos, top_k, min_tokens, continuous_usage_stats) are accepted.
"""

import asyncio
import json
from dataclasses import replace
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request

from sluice.gateway.errors import ApiError
from sluice.outcomes import Reason


BodyT = TypeVar("BodyT", bound="_Body")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    def cross_field_error(self) -> ApiError | None:
        """Rules between fields (pydantic checks each field alone); None: none broken."""
        return None


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
# OpenAI allows 4 stop sequences. Their length has no documented bound; the
# router's matcher holds back up to the longest one's length of text, so
# it is bounded (far above any real stop string).
MAX_STOPS = 4
MAX_STOP_CHARS = 1024
# seed is a signed 64-bit integer in OpenAI's and vLLM's APIs.
SEED_RANGE = (-(2**63), 2**63 - 1)


class SamplingFields(_Body):
    model: str = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKEN_COUNT)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOKEN_COUNT)] | None = None  # -1 and 0 both mean off (vLLM uses -1)
    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])] | None = None
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
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"a stop sequence is at most {MAX_STOP_CHARS} characters")
        return stop

    def cross_field_error(self) -> ApiError | None:
        limit = self.output_limit()
        if limit is not None and self.min_tokens > limit:
            return ApiError.of(Reason.INVALID_REQUEST, f"Invalid value for 'min_tokens': {self.min_tokens} is more "
                               f"than the output limit ({limit}).", param="min_tokens")
        return None

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


async def read_json_body(request: Request, max_body_bytes: int, timeout_s: float) -> Any:
    """The body as a JSON document: at most `max_body_bytes`, read within
    `timeout_s` (a client that declares more than it sends is not waited on
    for ever), nested at most MAX_JSON_DEPTH deep, every string Unicode text
    that UTF-8 can carry."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise ApiError.of(Reason.REQUEST_TOO_LARGE, f"Request body is over the {max_body_bytes}-byte limit.")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > max_body_bytes:
                    raise ApiError.of(Reason.REQUEST_TOO_LARGE,
                                      f"Request body is over the {max_body_bytes}-byte limit.")
    except TimeoutError:
        # The rest of the body may still come: the connection cannot carry
        # another request, so it closes after this answer.
        error = ApiError.of(Reason.REQUEST_TIMEOUT, f"The request body did not arrive within {timeout_s:g} s.")
        raise replace(error, headers={"connection": "close"}) from None
    try:
        document = json.loads(body, parse_constant=_no_constants)
    except RecursionError:
        raise ApiError.of(Reason.INVALID_JSON, f"The request body nests deeper than {MAX_JSON_DEPTH} levels.") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError.of(Reason.INVALID_JSON, f"The request body is not valid JSON: {error}") from error
    check_document(document)
    return document


# Deeper than any OpenAI body (a tool's JSON schema included) needs; the
# parser and the validators recurse, so depth is bounded before they run.
MAX_JSON_DEPTH = 64


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def check_document(document: Any) -> None:
    """400 naming the place, for nesting past MAX_JSON_DEPTH or a string
    (key or value) that is not encodable text: a lone UTF-16 surrogate such
    as "\\ud800" is valid JSON but no UTF-8 string, and protobuf, the chat
    template and the tokenizer all need one."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            raise ApiError.of(Reason.INVALID_JSON, f"The request body nests deeper than {MAX_JSON_DEPTH} levels.")
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, path)
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(index))) for index, item in enumerate(value))


def _check_text(text: str, path: tuple[str, ...]) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        param = ".".join(path) or None
        raise ApiError.of(Reason.INVALID_REQUEST, f"Invalid value for '{param}': the string holds a lone UTF-16 "
                          "surrogate, which is not Unicode text.", param=param) from None


def parse_body(model: type[BodyT], document: Any) -> BodyT:
    if not isinstance(document, dict):
        raise ApiError.of(Reason.INVALID_REQUEST, "The request body must be a JSON object.")
    try:
        body = model.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        raise ApiError.of(Reason.INVALID_REQUEST, f"Invalid value for '{param}': {message}", param=param) from None
    problem = body.cross_field_error()
    if problem is not None:
        raise problem
    return body
