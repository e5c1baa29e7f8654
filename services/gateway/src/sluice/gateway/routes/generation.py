"""POST /v1/chat/completions and POST /v1/completions.

Both go the same way: authenticate, validate, pre-check size, open the
router stream and wait for its first event (so a refusal is a clean HTTP
status), then either stream SSE or collect one JSON body. A client that
goes away cancels the router call, which cancels the replica call.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sluice.gateway import sse
from sluice.gateway.auth import authenticate
from sluice.gateway.errors import ApiError, from_service_error
from sluice.gateway.heartbeat import with_heartbeat
from sluice.gateway.openai_format import FINISH_REASONS, ResponseFormat, usage_body
from sluice.gateway.router_client import OpenedStream
from sluice.gateway.schemas import ChatCompletionRequest, CompletionRequest, parse_body, read_json_body
from sluice.gateway.state import GatewayState
from sluice.gateway.translate import generate_request
from sluice.rpc.errors import ServiceError, from_rpc_error
from sluice.v1 import common_pb2

log = logging.getLogger(__name__)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, ChatCompletionRequest)


async def completions(request: Request) -> Response:
    return await _generate(request, CompletionRequest)


async def _generate(request: Request, body_model: type[ChatCompletionRequest] | type[CompletionRequest]) -> Response:
    state: GatewayState = request.app.state.gateway
    arrived_s = time.monotonic()
    model = "unknown"
    try:
        tenant = authenticate(request, state.authenticator)
        body = parse_body(body_model, await read_json_body(request, state.settings.max_body_bytes))
        model = body.model
        if body.prompt_chars() > state.settings.max_prompt_chars:
            raise ApiError(
                400, f"The prompt is over {state.settings.max_prompt_chars} characters, more than any "
                "model here can take.", "context_length_exceeded", param="messages",
            )
        request_id = uuid.uuid4().hex
        routed = generate_request(body, tenant, request_id, state.settings.default_max_tokens)
        try:
            opened = await state.router.open_stream(routed)
        except ServiceError as error:
            raise from_service_error(error) from None
    except ApiError as error:
        state.metrics.requests_total.labels(model, str(error.status), error.code or "error").inc()
        return error.response()

    admitted = opened.first_event.admitted
    fmt = ResponseFormat.for_request(request_id, body.model, admitted.model_version, body_model is ChatCompletionRequest)
    if body.stream:
        options = body.stream_options
        relay = _sse_events(
            state, opened, fmt, arrived_s,
            include_usage=bool(options and options.include_usage),
            continuous_usage=bool(options and options.continuous_usage_stats),
            prompt_tokens=admitted.prompt_tokens,
        )
        return StreamingResponse(
            relay, media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _collect(request, state, opened, fmt, arrived_s)


async def _sse_events(
    state: GatewayState,
    opened: OpenedStream,
    fmt: ResponseFormat,
    arrived_s: float,
    *,
    include_usage: bool,
    continuous_usage: bool,
    prompt_tokens: int,
) -> AsyncIterator[bytes]:
    state.metrics.streams_active.inc()
    outcome = "cancelled"
    first_token = True
    output_tokens = 0
    try:
        yield sse.event(fmt.chunk("", None, first=True))
        async for event in with_heartbeat(opened.rest, state.settings.keepalive_interval_s):
            if event is None:
                yield sse.comment()
                continue
            kind = event.WhichOneof("event")
            if kind == "delta":
                output_tokens += len(event.delta.token_ids)
                if not event.delta.text and not continuous_usage:
                    continue
                if first_token:
                    first_token = False
                    state.metrics.time_to_first_token_seconds.labels(fmt.model).observe(time.monotonic() - arrived_s)
                chunk = fmt.chunk(event.delta.text, None)
                if continuous_usage:
                    chunk["usage"] = usage_body(common_pb2.Usage(prompt_tokens=prompt_tokens, output_tokens=output_tokens))
                yield sse.event(chunk)
            elif kind == "finished":
                finished = event.finished
                chunk = fmt.chunk(None, FINISH_REASONS.get(finished.finish_reason, "stop"))
                if continuous_usage:
                    chunk["usage"] = usage_body(finished.usage)
                yield sse.event(chunk)
                if include_usage:
                    yield sse.event(fmt.usage_chunk(finished.usage))
                outcome = "finished"
                break
            elif kind == "error":
                outcome = "error"
                yield sse.event(ApiError(500, event.error.message, event.error.code).body())
                break
        yield sse.DONE
    except grpc.aio.AioRpcError as error:
        outcome = "error"
        failure = from_rpc_error(error)
        yield sse.event(ApiError(500, failure.info.message, failure.info.reason).body())
        yield sse.DONE
    finally:
        # Reached on normal end and on cancellation (the client went away):
        # cancelling the router call propagates to the replica.
        opened.call.cancel()
        state.metrics.streams_active.dec()
        state.metrics.requests_total.labels(fmt.model, "200", outcome).inc()
        state.metrics.e2e_request_latency_seconds.labels(fmt.model).observe(time.monotonic() - arrived_s)


async def _collect(
    request: Request, state: GatewayState, opened: OpenedStream, fmt: ResponseFormat, arrived_s: float
) -> Response:
    """Non-streaming: gather the whole answer, but still stop the replica's
    work if the client disconnects while waiting."""
    collector = asyncio.create_task(_gather(opened))
    disconnect = asyncio.create_task(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({collector, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
        if not collector.done():
            collector.cancel()
            opened.call.cancel()
    if collector not in done:
        state.metrics.requests_total.labels(fmt.model, "499", "cancelled").inc()
        return Response(status_code=499)
    try:
        text, finished = collector.result()
    except ApiError as error:
        state.metrics.requests_total.labels(fmt.model, str(error.status), error.code or "error").inc()
        return error.response()
    state.metrics.requests_total.labels(fmt.model, "200", "finished").inc()
    state.metrics.e2e_request_latency_seconds.labels(fmt.model).observe(time.monotonic() - arrived_s)
    reason = FINISH_REASONS.get(finished.finish_reason, "stop")
    return JSONResponse(fmt.full_response(text, reason, finished.usage))


async def _gather(opened: OpenedStream):
    parts: list[str] = []
    try:
        async for event in opened.rest:
            kind = event.WhichOneof("event")
            if kind == "delta":
                parts.append(event.delta.text)
            elif kind == "finished":
                return "".join(parts), event.finished
            elif kind == "error":
                raise ApiError(500, event.error.message, event.error.code)
    except grpc.aio.AioRpcError as error:
        raise from_service_error(from_rpc_error(error)) from None
    raise ApiError(500, "The generation ended without finishing.", "internal_error")


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
