"""Errors in OpenAI's shape, and the one mapping from reasons to HTTP.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages", "code": "..."}}

The HTTP status is the reason's (sluice.outcomes), so request_too_large is
413 though it travels as INVALID_ARGUMENT; a reason the vocabulary lacks
(a newer peer's) falls back to its gRPC status. Every 429 and 503 carries
Retry-After (whole seconds, rounded up, at least 1), retry-after-ms (the
openai SDK reads it first) and x-sluice-reject-reason, so clients and
dashboards see why and when to come back.
"""

import math
from dataclasses import dataclass, field

import grpc
from starlette.responses import JSONResponse

from sluice.outcomes import OUTCOMES, Reason, outcome_of
from sluice.rpc.errors import ServiceError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",  # the client was too slow to send its request
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

# For reasons outside the vocabulary only.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

REJECT_REASON_HEADER = "x-sluice-reject-reason"
RETRY_AFTER_MS_HEADER = "retry-after-ms"
# A 429 or 503 whose refuser named no time still tells the client when.
DEFAULT_RETRY_AFTER_S = 1.0
RETRY_STATUSES = (429, 503)
INTERNAL_MESSAGE = "The server had an error while processing the request."


@dataclass(frozen=True, slots=True)
class ApiError(Exception):
    status: int
    message: str
    code: str | None = None
    param: str | None = None
    retry_after_s: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls, reason: Reason, message: str, *, param: str | None = None, retry_after_s: float | None = None
    ) -> "ApiError":
        """A gateway-local refusal: the HTTP status is the reason's."""
        return cls(OUTCOMES[reason].http_status, message, reason.value, param=param, retry_after_s=retry_after_s)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = dict(self.headers)
        if self.code:
            headers[REJECT_REASON_HEADER] = self.code
        retry_after_s = self.retry_after_s
        if retry_after_s is None and self.status in RETRY_STATUSES:
            retry_after_s = DEFAULT_RETRY_AFTER_S
        if retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
            headers[RETRY_AFTER_MS_HEADER] = str(max(1, math.ceil(retry_after_s * 1000)))
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def error_for_reason(
    reason: str,
    message: str,
    *,
    status_if_unknown: int,
    param: str | None = None,
    retry_after_s: float | None = None,
) -> ApiError:
    """The error for a reason another part sent, passed through as the code:
    its outcome's status when the vocabulary has it, else `status_if_unknown`."""
    outcome = outcome_of(reason)
    status = outcome.http_status if outcome is not None else status_if_unknown
    return ApiError(status, message, reason or None, param=param, retry_after_s=retry_after_s)


def from_service_error(error: ServiceError) -> ApiError:
    """A refusal or failure of a call to the router. A 500 says no more than
    that: the message of a call that failed without a reason may name
    internals."""
    info = error.info
    api_error = error_for_reason(
        info.reason, info.message, status_if_unknown=HTTP_STATUS.get(info.status, 500), retry_after_s=info.retry_after_s
    )
    if api_error.status == 500:
        known = info.outcome is not None
        return ApiError(500, INTERNAL_MESSAGE, info.reason if known else Reason.INTERNAL_ERROR.value)
    return api_error
