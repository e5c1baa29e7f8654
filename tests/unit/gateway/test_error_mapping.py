"""The gateway's one mapping to HTTP: a reason's outcome decides the status
(413 for request_too_large though it travels as INVALID_ARGUMENT), an
unknown reason falls back to its gRPC status, and every 429 and 503 says
when to come back in both headers the openai SDK reads."""

import grpc
import pytest

from sluice.gateway.errors import ApiError, error_for_reason, from_service_error
from sluice.outcomes import OUTCOMES, Reason
from sluice.rpc.errors import ServiceError


def test_request_too_large_is_413_not_the_400_of_its_grpc_status():
    error = from_service_error(ServiceError.of(Reason.REQUEST_TOO_LARGE, "too big"))
    assert (error.status, error.code, error.message) == (413, "request_too_large", "too big")
    assert ApiError.of(Reason.REQUEST_TOO_LARGE, "too big").status == 413


@pytest.mark.parametrize("reason", [r for r, o in OUTCOMES.items() if o.http_status != 500])
def test_every_reason_maps_to_its_outcome_status(reason):
    error = from_service_error(ServiceError.of(reason, "m"))
    assert (error.status, error.code) == (OUTCOMES[reason].http_status, reason.value)


def headers_of(error: ApiError) -> dict[str, str]:
    return {key.lower(): value for key, value in error.response().headers.items()}


def test_a_429_carries_retry_after_rounded_up_and_retry_after_ms():
    headers = headers_of(from_service_error(ServiceError.of(Reason.OVER_CAPACITY, "busy", retry_after_s=2.2)))
    assert headers["retry-after"] == "3"
    assert headers["retry-after-ms"] == "2200"
    assert headers["x-sluice-reject-reason"] == "over_capacity"


def test_a_short_wait_is_still_at_least_a_second_and_a_millisecond():
    headers = headers_of(ApiError.of(Reason.RATE_LIMIT_EXCEEDED, "slow down", retry_after_s=0.0001))
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("1", "1")


@pytest.mark.parametrize("reason", [r for r, o in OUTCOMES.items() if o.http_status in (429, 503)])
def test_every_429_and_503_says_when_and_why_even_without_a_refuser_time(reason):
    error = from_service_error(ServiceError.of(reason, "later"))
    response = error.response()
    assert response.status_code in (429, 503)
    headers = headers_of(error)
    assert headers["retry-after"] == "1" and headers["retry-after-ms"] == "1000"
    assert headers["x-sluice-reject-reason"] == reason.value


def test_a_400_says_no_retry_after():
    headers = headers_of(ApiError.of(Reason.CONTEXT_LENGTH_EXCEEDED, "long"))
    assert "retry-after" not in headers and "retry-after-ms" not in headers


@pytest.mark.parametrize(("status", "http"), [
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    (grpc.StatusCode.UNAVAILABLE, 503),
    (grpc.StatusCode.INVALID_ARGUMENT, 400),
    (grpc.StatusCode.NOT_FOUND, 404),
])
def test_an_unknown_reason_falls_back_by_its_grpc_status_and_passes_through(status, http):
    error = from_service_error(ServiceError(status, "a_newer_reason", "m"))
    assert (error.status, error.code) == (http, "a_newer_reason")


def test_an_unknown_reason_with_an_internal_status_is_a_plain_500():
    error = from_service_error(ServiceError(grpc.StatusCode.UNKNOWN, "a_newer_reason", "Traceback at 10.0.0.3"))
    assert (error.status, error.code) == (500, "internal_error")
    assert "10.0.0.3" not in error.message


def test_a_known_500_keeps_its_reason_but_not_its_message():
    error = from_service_error(ServiceError.of(Reason.ENGINE_ERROR, "CUDA error at kernel.cu:12"))
    assert (error.status, error.code) == (500, "engine_error")
    assert "kernel.cu" not in error.message
    assert error.body()["error"]["type"] == "server_error"


def test_stream_errors_follow_the_outcome_and_keep_the_routers_message():
    lost = error_for_reason("replica_lost", "the model replica failed: gone", status_if_unknown=500)
    assert (lost.status, lost.body()["error"]) == (503, {
        "message": "the model replica failed: gone", "type": "service_unavailable_error", "param": None,
        "code": "replica_lost",
    })
    assert error_for_reason("whatever_else", "m", status_if_unknown=500).status == 500


@pytest.mark.parametrize(("reason", "status", "kind"), [
    (Reason.MISSING_API_KEY, 401, "authentication_error"),
    (Reason.INVALID_API_KEY, 401, "authentication_error"),
    (Reason.PERMISSION_DENIED, 403, "permission_error"),
    (Reason.INVALID_JSON, 400, "invalid_request_error"),
    (Reason.INVALID_IDEMPOTENCY_KEY, 400, "invalid_request_error"),
    (Reason.REQUEST_IN_PROGRESS, 409, "conflict_error"),
    (Reason.LIMITS_UNAVAILABLE, 503, "service_unavailable_error"),
    (Reason.LEDGER_UNAVAILABLE, 503, "service_unavailable_error"),
])
def test_gateway_local_refusals_keep_their_statuses_and_openai_shape(reason, status, kind):
    error = ApiError.of(reason, "m", param="p")
    assert error.status == status
    assert error.body() == {"error": {"message": "m", "type": kind, "param": "p", "code": reason.value}}
