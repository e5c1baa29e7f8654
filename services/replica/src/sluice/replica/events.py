"""Engine outputs and failures as the replica's wire events (both Generate RPCs)."""

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


def token_events(outputs: list[RequestOutput]) -> list[replica_pb2.TokenEvent]:
    """One request's outputs, oldest first -> one delta (if any tokens) and,
    when the last one finished the request, its finished event."""
    events = []
    last = outputs[-1]
    token_ids = [t for output in outputs for t in output.new_token_ids]
    if token_ids:
        events.append(replica_pb2.TokenEvent(tokens=replica_pb2.TokenDelta(
            token_ids=token_ids, cached_prompt_tokens=last.num_cached_tokens)))
    if last.finished:
        events.append(replica_pb2.TokenEvent(finished=replica_pb2.TokenFinished(
            finish_reason=FINISH_REASONS[last.finish_reason],
            usage=common_pb2.Usage(
                prompt_tokens=last.num_prompt_tokens,
                cached_prompt_tokens=last.num_cached_tokens,
                output_tokens=last.num_output_tokens,
            ),
        )))
    return events


def failure_info(error: BaseException) -> ErrorInfo:
    """What the model thread handed a request instead of an output."""
    if isinstance(error, ServiceError):
        return error.info
    if isinstance(error, ValueError):  # the engine refused it (can never fit)
        return ServiceError.of(Reason.INVALID_REQUEST, str(error)).info
    return ServiceError.of(Reason.ENGINE_ERROR, "the engine step failed").info  # detail logged there
