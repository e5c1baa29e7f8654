"""ServiceError.of takes the status from the vocabulary, and from_rpc_error
names the hop the caller gives when a call failed without a peer's reason."""

from types import SimpleNamespace

import grpc
import pytest

from sluice.outcomes import OUTCOMES, Reason
from sluice.rpc.errors import (
    REASON_METADATA_KEY,
    RETRY_AFTER_METADATA_KEY,
    ServiceError,
    from_request_failed,
    from_rpc_error,
    request_failed,
)


@pytest.mark.parametrize("reason", list(Reason))
def test_of_takes_the_status_from_the_table(reason):
    error = ServiceError.of(reason, "why")
    assert error.info.status == grpc.StatusCode[OUTCOMES[reason].grpc_status]
    assert error.info.reason == reason.value and type(error.info.reason) is str
    assert error.info.outcome is OUTCOMES[reason]


def test_of_keeps_retry_after_across_a_multiplexed_call():
    error = ServiceError.of(Reason.OVER_CAPACITY, "busy", retry_after_s=2.5)
    assert error.info.status == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert from_request_failed(request_failed(error.info)).info == error.info


class FakeRpcError(grpc.aio.AioRpcError):
    """The parts of AioRpcError that from_rpc_error reads."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata=()) -> None:
        self._fake = SimpleNamespace(code=code, details=details, metadata=tuple(metadata))

    def code(self):
        return self._fake.code

    def details(self):
        return self._fake.details

    def trailing_metadata(self):
        return self._fake.metadata


def test_from_rpc_error_rebuilds_the_peers_reason_and_retry_after():
    raised = ServiceError.of(Reason.QUEUE_FULL, "queue is full", retry_after_s=3.0)
    back = from_rpc_error(
        FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue is full", raised.trailing_metadata()),
        unreachable=Reason.ROUTER_UNAVAILABLE,
    )
    assert back.info == raised.info


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.CANCELLED])
def test_a_call_that_lost_its_peer_is_the_hop_the_caller_names(code):
    lost = from_rpc_error(FakeRpcError(code, "connection refused"), unreachable=Reason.ROUTER_UNAVAILABLE)
    assert (lost.info.status, lost.info.reason) == (grpc.StatusCode.UNAVAILABLE, "router_unavailable")


def test_a_peer_that_failed_without_a_reason_is_an_internal_error():
    odd = from_rpc_error(FakeRpcError(grpc.StatusCode.UNKNOWN, "Exception calling application"),
                         unreachable=Reason.REPLICA_LOST)
    assert (odd.info.status, odd.info.reason) == (grpc.StatusCode.INTERNAL, "internal_error")


def test_an_unknown_reason_from_a_newer_peer_passes_through_with_its_status():
    newer = from_rpc_error(
        FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "x",
                     ((REASON_METADATA_KEY, "brand_new_reason"), (RETRY_AFTER_METADATA_KEY, "1.500"))),
        unreachable=Reason.ROUTER_UNAVAILABLE,
    )
    assert (newer.info.status, newer.info.reason, newer.info.retry_after_s) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "brand_new_reason", 1.5)
    assert newer.info.outcome is None
