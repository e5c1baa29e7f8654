"""The gateway's memory of a tenant-cap refusal: refuses that tenant's
next requests at once with the rest of the Retry-After, for that model
only, never longer than MAX_BACKOFF_S; when one of the tenant's requests
ends it lets one more through; when the wait is over it lets one probe
through, not the herd, and forgets once a probe meets no cap or no one
waits on it."""

from sluice.gateway.tenant_backoff import MAX_BACKOFF_S, PROBE_RETRY_S, PROBE_TIMEOUT_S, TenantBackoff
from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def refusal(reason: Reason, retry_after_s: float | None = 3.0) -> ServiceError:
    return ServiceError.of(reason, "this key holds too much", retry_after_s=retry_after_s)


def test_a_tenant_cap_refusal_refuses_the_next_request_with_the_remaining_wait():
    clock = Clock()
    backoff = TenantBackoff(clock)
    backoff.remember("acme", "tiny", "batch", refusal(Reason.TENANT_KV_SHARE))
    clock.now_s += 1.0
    assert backoff.check("acme", "tiny", "interactive") is None  # caps count each class apart
    error = backoff.check("acme", "tiny", "batch")
    assert error is not None and error.status == 429 and error.code == "tenant_kv_share"
    assert abs(error.retry_after_s - 2.0) < 1e-9
    assert backoff.check("acme", "other-model", "batch") is None
    assert backoff.check("other-tenant", "tiny", "batch") is None
    clock.now_s += 2.0
    assert backoff.check("acme", "tiny", "batch") is None  # the wait is over: ask the scheduler again


def test_only_tenant_caps_with_a_retry_after_are_remembered():
    backoff = TenantBackoff(Clock())
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.OVER_CAPACITY))  # the pool's, not the tenant's
    backoff.remember("acme", "m2", "interactive", refusal(Reason.TENANT_CONCURRENCY, retry_after_s=None))
    assert backoff.check("acme", "tiny", "interactive") is None and backoff.check("acme", "m2", "interactive") is None


def test_a_long_retry_after_is_trusted_for_at_most_the_cap():
    clock = Clock()
    backoff = TenantBackoff(clock)
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_CONCURRENCY, retry_after_s=600.0))
    assert backoff.check("acme", "tiny", "interactive").retry_after_s <= MAX_BACKOFF_S
    clock.now_s += MAX_BACKOFF_S
    assert backoff.check("acme", "tiny", "interactive") is None


def test_each_ending_request_of_the_tenant_lets_one_more_through():
    backoff = TenantBackoff(Clock())
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE))
    backoff.remember("acme", "m2", "interactive", refusal(Reason.TENANT_CONCURRENCY))
    backoff.remember("other", "tiny", "interactive", refusal(Reason.TENANT_CONCURRENCY))
    backoff.freed("acme")
    backoff.freed("acme")
    for _ in range(2):  # two ended: two go to the scheduler, per model remembered
        assert backoff.check("acme", "tiny", "interactive") is None
        assert backoff.check("acme", "m2", "interactive") is None
    # The herd behind them is still refused here, as is the other tenant.
    assert backoff.check("acme", "tiny", "interactive").code == "tenant_kv_share"
    assert backoff.check("other", "tiny", "interactive") is not None


def test_a_pass_that_is_refused_again_is_remembered_afresh():
    clock = Clock()
    backoff = TenantBackoff(clock)
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE, retry_after_s=1.0))
    backoff.freed("acme")
    assert backoff.check("acme", "tiny", "interactive") is None
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE, retry_after_s=4.0))
    clock.now_s += 2.0  # past the first Retry-After, inside the second
    assert abs(backoff.check("acme", "tiny", "interactive").retry_after_s - 2.0) < 1e-9


def test_a_pass_refused_for_another_reason_comes_back():
    backoff = TenantBackoff(Clock())
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE))
    backoff.freed("acme")
    assert backoff.check("acme", "tiny", "interactive") is None
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.REQUEST_TOO_LARGE, retry_after_s=None))
    assert backoff.check("acme", "tiny", "interactive") is None  # the room it stood for is still there
    assert backoff.check("acme", "tiny", "interactive") is not None


def test_refusals_from_memory_are_spread_by_how_often_the_tenants_requests_end():
    clock = Clock()
    backoff = TenantBackoff(clock)
    for _ in range(3):  # its requests have been ending every 0.5 s
        backoff.freed("acme")
        clock.now_s += 0.5
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE, retry_after_s=1.0))
    waits = [backoff.check("acme", "tiny", "interactive").retry_after_s for _ in range(3)]
    assert [round(w, 9) for w in waits] == [1.0, 1.5, 2.0]
    assert backoff.check("other", "tiny", "interactive") is None


def _expired(retry_after_s: float = 1.0) -> tuple[Clock, TenantBackoff]:
    """A memory whose wait has just ended."""
    clock = Clock()
    backoff = TenantBackoff(clock)
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE, retry_after_s=retry_after_s))
    clock.now_s += retry_after_s
    return clock, backoff


def test_the_end_of_the_wait_lets_one_probe_through_not_the_herd():
    _, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None  # the probe
    herd = [backoff.check("acme", "tiny", "interactive") for _ in range(20)]
    assert all(error is not None and error.code == "tenant_kv_share" for error in herd)
    assert min(error.retry_after_s for error in herd) >= PROBE_RETRY_S


def test_a_probe_refused_at_the_cap_is_remembered_afresh():
    clock, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE, retry_after_s=2.0))
    clock.now_s += 1.0
    assert abs(backoff.check("acme", "tiny", "interactive").retry_after_s - 1.0) < 1e-9


def test_a_probe_admitted_with_no_one_waiting_ends_the_memory():
    _, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None
    backoff.admitted("acme", "tiny", "interactive")
    assert all(backoff.check("acme", "tiny", "interactive") is None for _ in range(5))


def test_a_probe_admitted_while_others_waited_lets_the_next_one_probe():
    _, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None
    assert backoff.check("acme", "tiny", "interactive") is not None  # waits on the probe
    backoff.admitted("acme", "tiny", "interactive")
    assert backoff.check("acme", "tiny", "interactive") is None  # the next probe
    assert backoff.check("acme", "tiny", "interactive") is not None  # one trip at a time
    backoff.admitted("acme", "tiny", "interactive")
    # Another admission, with someone refused meanwhile: still one at a time.
    assert backoff.check("acme", "tiny", "interactive") is None
    backoff.admitted("acme", "tiny", "interactive")  # no one waited on this one
    assert backoff.check("acme", "tiny", "interactive") is None
    assert backoff.check("acme", "tiny", "interactive") is None


def test_an_admission_that_is_no_probe_changes_nothing():
    clock = Clock()
    backoff = TenantBackoff(clock)
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.TENANT_KV_SHARE))
    backoff.freed("acme")
    assert backoff.check("acme", "tiny", "interactive") is None  # a pass, not a probe
    backoff.admitted("acme", "tiny", "interactive")
    assert backoff.check("acme", "tiny", "interactive") is not None


def test_a_probe_refused_for_another_reason_ends_the_memory():
    _, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None
    assert backoff.check("acme", "tiny", "interactive") is not None
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.OVER_CAPACITY))  # the pool's limit, not the cap
    assert all(backoff.check("acme", "tiny", "interactive") is None for _ in range(5))


def test_a_probe_never_answered_is_replaced_after_its_timeout():
    clock, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None  # its caller leaves; no answer comes
    clock.now_s += PROBE_TIMEOUT_S - 0.1
    assert backoff.check("acme", "tiny", "interactive") is not None
    clock.now_s += 0.1
    assert backoff.check("acme", "tiny", "interactive") is None  # the next probe
    assert backoff.check("acme", "tiny", "interactive") is not None


def test_a_memory_nothing_was_refused_by_for_a_while_is_forgotten():
    clock, backoff = _expired()
    clock.now_s += MAX_BACKOFF_S
    assert all(backoff.check("acme", "tiny", "interactive") is None for _ in range(5))


def test_a_probe_that_never_reached_the_scheduler_lets_the_next_request_probe():
    _, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None  # the probe: then its bucket refuses it
    assert backoff.check("acme", "tiny", "interactive") is not None
    backoff.abandoned("acme", "tiny", "interactive")
    assert backoff.check("acme", "tiny", "interactive") is None  # the next probe, not a 5 s wait
    assert backoff.check("acme", "tiny", "interactive") is not None


def test_a_probe_refused_for_itself_lets_the_next_request_probe():
    _, backoff = _expired()
    assert backoff.check("acme", "tiny", "interactive") is None
    backoff.remember("acme", "tiny", "interactive", refusal(Reason.REQUEST_TOO_LARGE, retry_after_s=None))
    assert backoff.check("acme", "tiny", "interactive") is None  # the next probe: the cap was not tried
    assert backoff.check("acme", "tiny", "interactive") is not None  # the rest still wait on it
