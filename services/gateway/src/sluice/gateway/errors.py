"""Errors in OpenAI's shape, and the one mapping from router statuses to HTTP.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages", "code": "..."}}

A 429 carries Retry-After (whole seconds, rounded up) and every rejection
carries x-sluice-reject-reason, so clients and dashboards see why.
"""

import math
from dataclasses import dataclass, field

import grpc
from starlette.responses import JSONResponse

from sluice.rpc.errors import ServiceError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

REJECT_REASON_HEADER = "x-sluice-reject-reason"


@dataclass(frozen=True, slots=True)
class ApiError(Exception):
    status: int
    message: str
    code: str | None = None
    param: str | None = None
    retry_after_s: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

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
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def from_service_error(error: ServiceError) -> ApiError:
    info = error.info
    status = HTTP_STATUS.get(info.status, 500)
    if status == 500:
        return ApiError(500, "The server had an error while processing the request.", "internal_error")
    retry = info.retry_after_s
    if status in (429, 503) and retry is None:
        retry = 1.0
    return ApiError(status, info.message, info.reason, retry_after_s=retry)
