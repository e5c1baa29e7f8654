"""Domain errors that cross a gRPC hop, and how they travel.

A service raises `ServiceError.of(Reason.X, message)`: the status comes from
the one vocabulary (sluice.outcomes), never from the raiser. The server
interceptor turns it into a gRPC status with two trailing metadata keys,
and the caller rebuilds the same `ServiceError` with `from_rpc_error`. On a
call that carries many requests a request's failure is a `RequestFailed`
event instead (`request_failed`, `from_request_failed`). The gateway then
maps the reason to HTTP. Reasons pass through every hop unchanged; a reason
a peer sent that this build does not know keeps its status.
"""

from dataclasses import dataclass

import grpc

from sluice.outcomes import OUTCOMES, Outcome, Reason, outcome_of
from sluice.v1 import common_pb2

REASON_METADATA_KEY = "x-sluice-reject-reason"
RETRY_AFTER_METADATA_KEY = "retry-after-s"

# A call that failed without a reason of the peer's: the transport gave up
# on the peer (or the peer cancelled the call), so the caller names the hop.
_PEER_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    status: grpc.StatusCode
    reason: str  # a sluice.outcomes Reason (or one a newer peer sent)
    message: str
    retry_after_s: float | None = None

    @property
    def outcome(self) -> Outcome | None:
        """The reason's row in the vocabulary; None for a string it lacks."""
        return outcome_of(self.reason)


class ServiceError(Exception):
    def __init__(
        self,
        status: grpc.StatusCode,
        reason: str,
        message: str,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        """Prefer `ServiceError.of`; this form rebuilds what a peer sent."""
        super().__init__(message)
        self.info = ErrorInfo(status, str(reason), message, retry_after_s)

    @classmethod
    def of(cls, reason: Reason, message: str, *, retry_after_s: float | None = None) -> "ServiceError":
        """The error for a reason, with the gRPC status the vocabulary gives it."""
        return cls(grpc.StatusCode[OUTCOMES[reason].grpc_status], reason.value, message, retry_after_s=retry_after_s)

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        pairs = [(REASON_METADATA_KEY, self.info.reason)]
        if self.info.retry_after_s is not None:
            pairs.append((RETRY_AFTER_METADATA_KEY, f"{self.info.retry_after_s:.3f}"))
        return tuple(pairs)


def from_rpc_error(error: grpc.aio.AioRpcError, *, unreachable: Reason) -> ServiceError:
    """Rebuild the domain error a peer raised. A call that failed without the
    peer's reason is `unreachable` (the caller says which hop that is, e.g.
    Reason.ROUTER_UNAVAILABLE) when the peer could not be reached or went
    away, else an internal error (the peer failed without saying why)."""
    metadata = {key: value for key, value in (error.trailing_metadata() or ())}
    reason = metadata.get(REASON_METADATA_KEY)
    details = error.details() or error.code().name.lower()
    if reason is None:
        if error.code() in _PEER_LOST:
            return ServiceError.of(unreachable, details)
        return ServiceError.of(Reason.INTERNAL_ERROR, details)
    retry_after = metadata.get(RETRY_AFTER_METADATA_KEY)
    return ServiceError(
        error.code(),
        str(reason),
        details,
        retry_after_s=float(retry_after) if retry_after is not None else None,
    )


_STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}


def request_failed(info: ErrorInfo) -> common_pb2.RequestFailed:
    """A request's failure as an event on a call that carries many requests."""
    failed = common_pb2.RequestFailed(status_code=info.status.value[0], reason=info.reason, message=info.message)
    if info.retry_after_s is not None:
        failed.retry_after_s = info.retry_after_s
    return failed


def from_request_failed(failed: common_pb2.RequestFailed) -> ServiceError:
    """The ServiceError a call of the request's own would have raised."""
    return ServiceError(
        _STATUS_BY_CODE.get(failed.status_code, grpc.StatusCode.INTERNAL),
        failed.reason or Reason.INTERNAL_ERROR.value,
        failed.message,
        retry_after_s=failed.retry_after_s if failed.HasField("retry_after_s") else None,
    )
