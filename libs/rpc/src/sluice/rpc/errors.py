"""Domain errors that cross a gRPC hop, and how they travel.

A service raises `ServiceError`; the server interceptor turns it into a gRPC
status with two trailing metadata keys, and the caller rebuilds the same
`ServiceError` with `from_rpc_error`. The gateway then maps it to HTTP.
"""

from dataclasses import dataclass

import grpc

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
