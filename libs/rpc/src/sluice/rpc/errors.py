"""Domain errors that cross a gRPC hop, and how they travel.

A service raises `ServiceError`; the server interceptor turns it into a gRPC
status with two trailing metadata keys, and the caller rebuilds the same
`ServiceError` with `from_rpc_error`. On a call that carries many requests a
request's failure is a `RequestFailed` event instead (`request_failed`,
`from_request_failed`). The gateway then maps it to HTTP.
"""

from dataclasses import dataclass

import grpc

from sluice.v1 import common_pb2

REASON_METADATA_KEY = "x-sluice-reject-reason"
RETRY_AFTER_METADATA_KEY = "retry-after-s"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    status: grpc.StatusCode
    reason: str  # a DESIGN.md rejection reason or another stable code
    message: str
    retry_after_s: float | None = None


class ServiceError(Exception):
    def __init__(
        self,
        status: grpc.StatusCode,
        reason: str,
        message: str,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.info = ErrorInfo(status, reason, message, retry_after_s)

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        pairs = [(REASON_METADATA_KEY, self.info.reason)]
        if self.info.retry_after_s is not None:
            pairs.append((RETRY_AFTER_METADATA_KEY, f"{self.info.retry_after_s:.3f}"))
        return tuple(pairs)


def from_rpc_error(error: grpc.aio.AioRpcError) -> ServiceError:
    """Rebuild the domain error a peer raised (or describe a transport failure)."""
    metadata = {key: value for key, value in (error.trailing_metadata() or ())}
    reason = metadata.get(REASON_METADATA_KEY)
    if reason is None:
        reason = "unavailable" if error.code() == grpc.StatusCode.UNAVAILABLE else "internal_error"
    retry_after = metadata.get(RETRY_AFTER_METADATA_KEY)
    return ServiceError(
        error.code(),
        str(reason),
        error.details() or str(error.code().name).lower(),
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
        failed.reason or "internal_error",
        failed.message,
        retry_after_s=failed.retry_after_s if failed.HasField("retry_after_s") else None,
    )
