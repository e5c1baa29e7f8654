"""A request's failure on a multiplexed call rebuilds the ServiceError a call
of its own would have raised: status, reason, message and Retry-After."""

import grpc

from sluice.rpc.errors import ServiceError, from_request_failed, request_failed


def test_round_trip_keeps_status_reason_message_and_retry_after():
    error = ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, "over_capacity", "busy", retry_after_s=2.5)
    back = from_request_failed(request_failed(error.info))
    assert back.info == error.info


def test_no_retry_after_stays_none_and_unknown_codes_become_internal():
    plain = from_request_failed(request_failed(ServiceError(grpc.StatusCode.NOT_FOUND, "model_not_found", "x").info))
    assert plain.info.retry_after_s is None and plain.info.status == grpc.StatusCode.NOT_FOUND
    failed = request_failed(plain.info)
    failed.status_code = 999
    failed.reason = ""
    odd = from_request_failed(failed)
    assert odd.info.status == grpc.StatusCode.INTERNAL and odd.info.reason == "internal_error"
