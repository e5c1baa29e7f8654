"""Answer a retry whose Idempotency-Key already finished, without running
the model again: the stored response, in the shape this retry asked for."""

from starlette.responses import JSONResponse, Response, StreamingResponse

from sluice.gateway import sse
from sluice.gateway.front_door import StoredResponse
from sluice.gateway.openai_format import ResponseFormat
from sluice.v1 import common_pb2

REPLAY_HEADER = {"x-sluice-idempotent-replay": "true"}


def replay_response(stored: StoredResponse, chat: bool, stream: bool, include_usage: bool) -> Response:
    fmt = ResponseFormat(stored.response_id, stored.model, stored.model_version, chat, stored.created_unix_s)
    usage = common_pb2.Usage(prompt_tokens=stored.prompt_tokens, cached_prompt_tokens=stored.cached_tokens,
                             output_tokens=stored.output_tokens)
    if not stream:
        return JSONResponse(fmt.full_response(stored.text, stored.finish_reason, usage), headers=REPLAY_HEADER)

    async def events():
        yield sse.event(fmt.chunk("", None, first=True))
        if stored.text:
            yield sse.event(fmt.chunk(stored.text, None))
        yield sse.event(fmt.chunk(None, stored.finish_reason))
        if include_usage:
            yield sse.event(fmt.usage_chunk(usage))
        yield sse.DONE

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache",
                                                                               **REPLAY_HEADER})
