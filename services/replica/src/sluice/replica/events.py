"""Engine outputs and failures as the replica's wire events (both Generate RPCs)."""

from collections.abc import Callable

from sluice.engine.plan import RequestOutput
from sluice.engine.request import FinishReason
from sluice.outcomes import Reason
from sluice.rpc.errors import ErrorInfo, ServiceError
from sluice.v1 import common_pb2, replica_pb2

FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
}


def add_token_events(add: Callable[[], replica_pb2.TokenEvent], outputs: list[RequestOutput]) -> None:
    """One request's outputs, oldest first, as one delta (if any tokens)
    and, when the last one finished the request, its finished event; each
    filled in place in a fresh event ``add()`` returns. In place, because a
    step's 64 events built as messages and then copied into the batch cost
    ~4x as much (~250 against ~65 us), on the replica's event loop, which
    shares the GIL with the engine thread."""
    last = outputs[-1]
    token_ids = [t for output in outputs for t in output.new_token_ids]
    if token_ids:
        delta = add().tokens
        delta.token_ids.extend(token_ids)
        delta.cached_prompt_tokens = last.num_cached_tokens
    if last.finished:
        finished = add().finished
        finished.finish_reason = FINISH_REASONS[last.finish_reason]
        usage = finished.usage
        usage.prompt_tokens = last.num_prompt_tokens
        usage.cached_prompt_tokens = last.num_cached_tokens
        usage.output_tokens = last.num_output_tokens


def token_events(outputs: list[RequestOutput]) -> list[replica_pb2.TokenEvent]:
    """`add_token_events` as a list of events."""
    events: list[replica_pb2.TokenEvent] = []

    def add() -> replica_pb2.TokenEvent:
        events.append(replica_pb2.TokenEvent())
        return events[-1]

    add_token_events(add, outputs)
    return events


def failure_info(error: BaseException) -> ErrorInfo:
    """What the model thread handed a request instead of an output."""
    if isinstance(error, ServiceError):
        return error.info
    if isinstance(error, ValueError):  # the engine refused it (can never fit)
        return ServiceError.of(Reason.INVALID_REQUEST, str(error)).info
    return ServiceError.of(Reason.ENGINE_ERROR, "the engine step failed").info  # detail logged there
