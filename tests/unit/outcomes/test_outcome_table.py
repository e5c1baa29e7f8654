"""The vocabulary of outcomes: every reason has exactly one row, and the
statuses agree with what DESIGN.md's error mapping says they mean."""

import grpc
import pytest

from sluice.outcomes import OUTCOMES, Reason, outcome_of


def test_every_reason_has_an_outcome_that_names_it():
    assert set(OUTCOMES) == set(Reason)
    for reason, outcome in OUTCOMES.items():
        assert outcome.reason is reason
        assert outcome.grpc_status in grpc.StatusCode.__members__, reason
        assert 400 <= outcome.http_status < 600, reason


@pytest.mark.parametrize("reason", [r for r, o in OUTCOMES.items() if o.http_status == 429])
def test_429_reasons_are_resource_exhausted_and_retryable(reason):
    assert OUTCOMES[reason].grpc_status == "RESOURCE_EXHAUSTED"
    assert OUTCOMES[reason].retryable


@pytest.mark.parametrize("reason", [r for r, o in OUTCOMES.items() if o.http_status == 503])
def test_503_reasons_are_unavailable_and_retryable(reason):
    assert OUTCOMES[reason].grpc_status == "UNAVAILABLE"
    assert OUTCOMES[reason].retryable


def test_the_statuses_go_the_other_way_too():
    for outcome in OUTCOMES.values():
        if outcome.grpc_status == "RESOURCE_EXHAUSTED":
            assert outcome.http_status == 429, outcome
        if outcome.grpc_status == "UNAVAILABLE":
            assert outcome.http_status == 503, outcome


def test_the_shared_names_of_design_md_keep_their_statuses():
    expected = {
        "rate_limit_exceeded": 429, "tenant_concurrency": 429, "tenant_kv_share": 429, "queue_full": 429,
        "over_capacity": 429, "batch_paused": 429, "context_length_exceeded": 400, "request_too_large": 413,
        "no_replica": 503, "replica_lost": 503, "scheduler_unavailable": 503, "router_unavailable": 503,
    }
    assert {name: outcome_of(name).http_status for name in expected} == expected
    # gRPC has no "too large": the table, not the status, makes it a 413.
    assert outcome_of("request_too_large").grpc_status == "INVALID_ARGUMENT"


def test_a_string_outside_the_vocabulary_has_no_outcome():
    assert outcome_of("some_newer_reason") is None
    assert outcome_of("") is None


def test_a_stream_that_took_too_long_is_the_readers_408_or_the_deadlines_504():
    # A client that stopped reading is its own doing (4xx) and no capacity
    # is contended, so it is not a 429 that would carry a Retry-After.
    slow = outcome_of("slow_reader")
    assert (slow.http_status, slow.grpc_status, slow.retryable) == (408, "DEADLINE_EXCEEDED", True)
    # The same request carries the same passed deadline: a retry cannot help.
    late = outcome_of("deadline_exceeded")
    assert (late.http_status, late.grpc_status, late.retryable) == (504, "DEADLINE_EXCEEDED", False)
