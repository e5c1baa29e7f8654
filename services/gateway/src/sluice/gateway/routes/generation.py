"""POST /v1/chat/completions and POST /v1/completions.

Both go the same way: authenticate, validate, pre-check size, pass the
front door (idempotency key, concurrency cap, token buckets), open the
router stream and wait for its first event (so a refusal is a clean HTTP
status), then stream SSE or collect one JSON body. The usage row is made
durable before the client hears that the stream finished. A client that
goes away cancels the router call, which cancels the replica call, and the
attempt is recorded unbilled.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from opentelemetry import trace
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sluice.gateway import sse
from sluice.gateway.auth import authenticate
from sluice.gateway.errors import ApiError, error_for_reason, from_service_error
from sluice.gateway.front_door import Outcome, StoredResponse, Ticket, idempotency_key_from
from sluice.gateway.heartbeat import with_heartbeat
from sluice.gateway.metrics import UNKNOWN_MODEL
from sluice.gateway.openai_format import FINISH_REASONS, ResponseFormat, usage_body
from sluice.gateway.replay import replay_response
from sluice.gateway.router_client import OpenedStream
from sluice.gateway.schemas import ChatCompletionRequest, CompletionRequest, parse_body, read_json_body
from sluice.gateway.state import GatewayState
from sluice.gateway.stream_timing import StreamTiming
from sluice.gateway.translate import generate_request
from sluice.limits import estimate_tokens
from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError
from sluice.telemetry import spans
from sluice.telemetry.carrier import inject_trace_context
from sluice.v1 import common_pb2, router_pb2

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
T = TypeVar("T")

# Output bound assumed for the bucket estimate when max_tokens is omitted;
# settling with the exact count corrects it when the request ends.
UNBOUNDED_OUTPUT_ESTIMATE_TOKENS = 512


async def chat_completions(request: Request) -> Response:
    return _with_response_headers(request, await _generate(request, ChatCompletionRequest))


async def completions(request: Request) -> Response:
    return _with_response_headers(request, await _generate(request, CompletionRequest))


def _with_response_headers(request: Request, response: Response) -> Response:
    """OpenAI's x-ratelimit-* headers on every answer to a request that
    took from the tenant's buckets (a refusal by them carries its own), and
    `x-sluice-degraded` on one an overload lever changed (`output_capped`:
    max_tokens was capped, a cut answer ends with finish_reason "length";
    `fallback`: a smaller version served it, as `model` says)."""
    headers = getattr(request.state, "rate_limit_headers", None)
    if headers:
        response.headers.update(headers)
    degraded = getattr(request.state, "degraded_header", None)
    if degraded:
        response.headers["x-sluice-degraded"] = degraded
    return response


@dataclass(slots=True)
class Progress:
    """What one response has produced so far (for billing and replay)."""

    fmt: ResponseFormat
    prompt_tokens: int
    keep_text: bool
    service_class: str = "interactive"
    output_tokens: int = 0
    parts: list[str] = field(default_factory=list)

    def add(self, delta: router_pb2.Delta) -> None:
        self.output_tokens += len(delta.token_ids)
        if self.keep_text:
            self.parts.append(delta.text)

    def finished(self, finished: router_pb2.Finished, replayable: bool) -> Outcome:
        usage = finished.usage
        reason = FINISH_REASONS.get(finished.finish_reason)
        if reason is None:  # cancelled or failed upstream: not a billable finish
            return self.unfinished(failed=True)
        replay = None
        if replayable:
            replay = StoredResponse(
                self.fmt.response_id, self.fmt.created_unix_s, self.fmt.model, self.fmt.model_version,
                "".join(self.parts), reason, usage.prompt_tokens, usage.cached_prompt_tokens, usage.output_tokens,
            )
        return Outcome(self.fmt.model, self.fmt.model_version, usage.prompt_tokens, usage.cached_prompt_tokens,
                       usage.output_tokens, reason, replay=replay, service_class=self.service_class)

    def unfinished(self, failed: bool) -> Outcome:
        return Outcome(self.fmt.model, self.fmt.model_version, self.prompt_tokens, 0, self.output_tokens, None,
                       failed=failed, service_class=self.service_class)


async def _generate(request: Request, body_model: type[ChatCompletionRequest] | type[CompletionRequest]) -> Response:
    state: GatewayState = request.app.state.gateway
    arrived_s = time.monotonic()
    model_label = UNKNOWN_MODEL  # for the metrics: a catalog name or "unknown", never the client's string
    chat = body_model is ChatCompletionRequest
    tenant_name: str | None = None
    span = trace.get_current_span()  # the HTTP server span (OpenTelemetryMiddleware)
    # Let through the backoff memory, and the scheduler's answer not yet
    # handed back to it: if the request ends first (the bucket refuses it, a
    # replay answers it, its caller leaves), the probe it may be is released.
    awaiting_answer = False
    try:
        with spans.current_span(tracer, "gateway.auth"):
            tenant = authenticate(request, state.authenticator)
        tenant_name = tenant.name
        span.set_attribute(spans.TENANT, tenant.name)
        document = await read_json_body(request, state.settings.max_body_bytes, state.settings.http_body_timeout_s)
        body = parse_body(body_model, document)
        model_label = state.metrics.models.label(body.model)
        tier = _tier(body)
        span.set_attributes({spans.MODEL: model_label, spans.SERVICE_CLASS: tier})
        if body.prompt_chars() > state.settings.max_prompt_chars:
            raise ApiError.of(
                Reason.CONTEXT_LENGTH_EXCEEDED, f"The prompt is over {state.settings.max_prompt_chars} characters, "
                "more than any model here can take.", param="messages",
            )
        backing_off = state.backoff.check(tenant.name, body.model, tier)
        if backing_off is not None:
            raise backing_off
        awaiting_answer = True
        key = idempotency_key_from(request.headers.get("idempotency-key"))
        estimate = estimate_tokens(body.prompt_chars(), body.output_limit() or UNBOUNDED_OUTPUT_ESTIMATE_TOKENS)
        with spans.current_span(tracer, "gateway.limits"):
            admitted = await state.front_door.admit(tenant, key, estimate)
        if isinstance(admitted, StoredResponse):
            state.metrics.requests_total.labels(model_label, "200", "replayed").inc()
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return replay_response(admitted, chat, body.stream, include_usage)
        ticket = admitted
        request.state.rate_limit_headers = ticket.reservation.status.headers()
        try:
            routed = generate_request(body, tenant, ticket.attempt_id, state.settings.default_max_tokens,
                                      state.stream_deadline, affinity_key=ticket.idempotency_key or "")
            span.set_attribute(spans.REQUEST_ID, ticket.attempt_id)
            inject_trace_context(routed.trace_context)  # the router's spans join this request's trace
            # A request may queue in the scheduler for a while before its
            # first event: a client that leaves meanwhile must leave the queue.
            opened = await _unless_disconnected(request, state.router.open_stream(routed))
            awaiting_answer = False
            state.backoff.admitted(tenant.name, body.model, tier)
        except ClientLeft:
            state.background.spawn(state.front_door.finish(ticket, None))
            state.metrics.requests_total.labels(model_label, "499", "client_left_queued").inc()
            return Response(status_code=499)
        except BaseException as error:
            # Nothing ran on a replica: give back the slot, the key and the estimate.
            state.background.spawn(state.front_door.finish(ticket, None))
            if isinstance(error, ServiceError):
                awaiting_answer = False
                state.backoff.remember(tenant.name, body.model, tier, error)
                raise from_service_error(error) from None
            raise
    except ApiError as error:
        state.metrics.requests_total.labels(model_label, str(error.status), error.code or "error").inc()
        state.metrics.rejected(error.code, tenant_name)
        span.set_attribute(spans.OUTCOME, error.code or "error")
        return error.response()
    finally:
        if awaiting_answer:
            state.backoff.abandoned(tenant.name, body.model, tier)

    admitted_event = opened.first_event.admitted
    state.metrics.models.learn(body.model)  # the router admitted it: a catalog name
    # Routed or served by a fallback: the response (and the bill) name the
    # version that served, under its own alias.
    served_model = admitted_event.model or body.model
    state.metrics.models.learn(served_model)
    if admitted_event.model_version:  # the router's catalog name of the version that serves it
        state.metrics.versions.learn(admitted_event.model_version)
    if admitted_event.degraded:
        request.state.degraded_header = ",".join(admitted_event.degraded)
    fmt = ResponseFormat.for_request(ticket.attempt_id, served_model, admitted_event.model_version, chat)
    # Text is kept for a non-streamed body, and for replay of idempotent requests.
    progress = Progress(fmt, admitted_event.prompt_tokens, keep_text=key is not None or not body.stream,
                        service_class=tier)
    span.set_attribute(spans.PROMPT_TOKENS, admitted_event.prompt_tokens)
    slo_s = state.settings.batch_ttft_slo_s if tier == "batch" else state.settings.interactive_ttft_slo_s
    timing = StreamTiming.start(state.metrics, fmt.model, tier, admitted_event.model_version, arrived_s, slo_s)
    if body.stream:
        options = body.stream_options
        relay = _sse_events(
            state, ticket, opened, progress, timing,
            include_usage=bool(options and options.include_usage),
            continuous_usage=bool(options and options.continuous_usage_stats),
        )
        return ClosingStreamingResponse(
            relay, media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _collect(request, state, ticket, opened, progress, timing)


async def _sse_events(
    state: GatewayState,
    ticket: Ticket,
    opened: OpenedStream,
    progress: Progress,
    timing: StreamTiming,
    *,
    include_usage: bool,
    continuous_usage: bool,
) -> AsyncIterator[bytes]:
    fmt = progress.fmt
    frames = fmt.content_frames()
    state.metrics.streams_active.inc()
    outcome = "cancelled"
    # The opening chunk (the role) goes out with the first frame after it,
    # and the last frames (finish, usage, [DONE]) with the end of the body:
    # each write is a loopback send and a wake-up of the client, so a short
    # answer costs three writes instead of seven, with the same bytes.
    pending = sse.event(fmt.chunk("", None, first=True))
    try:
        async for event in with_heartbeat(opened.rest, state.settings.keepalive_interval_s):
            if event is None:
                frame = sse.comment()
            else:
                kind = event.WhichOneof("event")
                if kind == "delta":
                    progress.add(event.delta)
                    if not event.delta.text and not continuous_usage:
                        continue
                    timing.content(time.monotonic())
                    if continuous_usage:
                        chunk = fmt.chunk(event.delta.text, None)
                        chunk["usage"] = usage_body(common_pb2.Usage(
                            prompt_tokens=progress.prompt_tokens, output_tokens=progress.output_tokens))
                        frame = sse.event(chunk)
                    else:
                        frame = frames.frame(event.delta.text)
                elif kind == "finished":
                    finished = event.finished
                    result = progress.finished(finished, ticket.owner is not None)
                    await state.background.run_to_completion(_finish(state, ticket, result))
                    if result.finish_reason is None:
                        outcome = "error"
                        pending += sse.event(ApiError.of(Reason.INTERNAL_ERROR, "The generation did not finish.").body())
                        break
                    outcome = "finished"
                    chunk = fmt.chunk(None, FINISH_REASONS.get(finished.finish_reason, "stop"))
                    if continuous_usage:
                        chunk["usage"] = usage_body(finished.usage)
                    pending += sse.event(chunk)
                    if include_usage:
                        pending += sse.event(fmt.usage_chunk(finished.usage))
                    break
                elif kind == "error":
                    outcome = "error"
                    pending += sse.event(_stream_error(event.error).body())
                    break
                else:
                    continue
            if pending:
                frame, pending = pending + frame, b""
            yield frame
        yield sse.LastFrame(pending + sse.DONE)
    except ServiceError as failure:  # the router or the call to it failed mid-stream
        outcome = "error"
        yield sse.LastFrame(pending + sse.event(from_service_error(failure).body()) + sse.DONE)
    finally:
        # Reached on normal end and on cancellation (the client went away):
        # cancelling upstream propagates to the replica.
        opened.cancel()
        if not ticket.finished:
            state.background.spawn(_finish(state, ticket, progress.unfinished(failed=outcome == "error")))
        state.metrics.streams_active.dec()
        state.metrics.requests_total.labels(fmt.model, "200", outcome).inc()
        timing.finished(time.monotonic(), outcome=outcome)
        trace.get_current_span().set_attributes({spans.OUTCOME: outcome, spans.OUTPUT_TOKENS: progress.output_tokens})


async def _collect(
    request: Request, state: GatewayState, ticket: Ticket, opened: OpenedStream, progress: Progress,
    timing: StreamTiming,
) -> Response:
    """Non-streaming: gather the whole answer, but still stop the replica's
    work if the client disconnects while waiting."""
    fmt = progress.fmt
    collector = asyncio.create_task(_gather(opened, progress))
    disconnect = asyncio.create_task(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({collector, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
        if not collector.done():
            collector.cancel()
            opened.cancel()
    if collector not in done:
        timing.finished(time.monotonic(), outcome="cancelled")
        state.background.spawn(_finish(state, ticket, progress.unfinished(failed=False)))
        state.metrics.requests_total.labels(fmt.model, "499", "cancelled").inc()
        return Response(status_code=499)
    try:
        finished = collector.result()
    except ApiError as error:
        timing.finished(time.monotonic(), outcome="error")
        state.background.spawn(_finish(state, ticket, progress.unfinished(failed=True)))
        state.metrics.requests_total.labels(fmt.model, str(error.status), error.code or "error").inc()
        state.metrics.rejected(error.code, ticket.tenant.name)
        return error.response()
    result = progress.finished(finished, ticket.owner is not None)
    await state.background.run_to_completion(_finish(state, ticket, result))
    if result.finish_reason is None:
        timing.finished(time.monotonic(), outcome="error")
        return ApiError.of(Reason.INTERNAL_ERROR, "The generation did not finish.").response()
    state.metrics.requests_total.labels(fmt.model, "200", "finished").inc()
    # One body: its first byte is its last, so TTFT is the whole wait.
    now_s = time.monotonic()
    timing.content(now_s)
    timing.finished(now_s, outcome="finished")
    reason = FINISH_REASONS.get(finished.finish_reason, "stop")
    return JSONResponse(fmt.full_response("".join(progress.parts), reason, finished.usage))


async def _gather(opened: OpenedStream, progress: Progress) -> router_pb2.Finished:
    try:
        async for event in opened.rest:
            kind = event.WhichOneof("event")
            if kind == "delta":
                progress.add(event.delta)
            elif kind == "finished":
                return event.finished
            elif kind == "error":
                raise _stream_error(event.error)
    except ServiceError as failure:
        raise from_service_error(failure) from None
    raise ApiError.of(Reason.INTERNAL_ERROR, "The generation ended without finishing.")


def _stream_error(error: router_pb2.Error) -> ApiError:
    """A failure after the stream started, as its reason's outcome says (a
    replica that went away is a 503, not a 500). The router's message names
    the failing hop, never internals, so it is kept."""
    return error_for_reason(error.code, error.message, status_if_unknown=500)


class ClosingStreamingResponse(StreamingResponse):
    """Closes the body generator however the response ends.

    If the client disconnects while a write is pending, Starlette abandons
    the generator suspended at its `yield`; its `finally` (cancel the router
    call, record the unbilled attempt, release slot and key) would then wait
    for the garbage collector. Closing it here runs that at once."""

    async def stream_response(self, send) -> None:
        """As Starlette's, but an `sse.LastFrame` ends the body in its own
        write (Starlette sends an empty body message after the last item,
        a write of its own)."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False
        async for chunk in self.body_iterator:
            ended = isinstance(chunk, sse.LastFrame)
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                try:
                    await asyncio.shield(asyncio.ensure_future(close()))
                except RuntimeError:  # it is still running: its own cancellation runs the finally
                    pass


def _tier(body: ChatCompletionRequest | CompletionRequest) -> str:
    """The class a request is served in, as the backoff keys it."""
    return "batch" if body.service_tier == "flex" else "interactive"


async def _finish(state: GatewayState, ticket: Ticket, outcome: Outcome | None) -> None:
    """The front door's accounting for a request that reached a replica; it
    ended, so what the scheduler's tenant caps count has changed."""
    state.backoff.freed(ticket.tenant.name)
    with spans.current_span(tracer, "gateway.ledger_write", {spans.REQUEST_ID: ticket.attempt_id}):
        await state.front_door.finish(ticket, outcome)


class ClientLeft(Exception):
    """The client disconnected before the response started."""


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientLeft (with `work` cancelled) if the client
    disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientLeft


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
