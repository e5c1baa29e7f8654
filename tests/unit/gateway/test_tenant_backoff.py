"""The gateway's memory of a tenant-cap refusal: refuses that tenant's
next requests at once with the rest of the Retry-After, for that model
only, never longer than MAX_BACKOFF_S, and forgets when one of the tenant's
requests ends it lets one more through."""

from sluice.gateway.tenant_backoff import MAX_BACKOFF_S, TenantBackoff
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
