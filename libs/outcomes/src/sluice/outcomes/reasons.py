"""The reasons, their statuses, and whether retrying may help.

    429 RESOURCE_EXHAUSTED   capacity exists but is contended: retry later
    503 UNAVAILABLE          none exists right now (no replica, one lost)
    400/404/409/413          the request itself is wrong: do not retry as is
    408/504                  a stream took too long: its reader (408) or its deadline (504)
    401/403                  the caller is not (allowed to be) who it says

Every retryable refusal carries a Retry-After computed by whoever refused.
"""

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    # Who is asking (gateway).
    MISSING_API_KEY = "missing_api_key"
    INVALID_API_KEY = "invalid_api_key"
    PERMISSION_DENIED = "permission_denied"
    # Tenant limits (gateway buckets, scheduler caps).
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    TENANT_CONCURRENCY = "tenant_concurrency"
    TENANT_KV_SHARE = "tenant_kv_share"
    # Pool capacity (scheduler).
    QUEUE_FULL = "queue_full"
    OVER_CAPACITY = "over_capacity"
    QUEUE_TIMEOUT = "queue_timeout"
    BATCH_PAUSED = "batch_paused"
    # The request itself.
    INVALID_REQUEST = "invalid_request"
    INVALID_JSON = "invalid_json"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    REQUEST_TOO_LARGE = "request_too_large"
    MODEL_NOT_FOUND = "model_not_found"
    DUPLICATE_REQUEST = "duplicate_request"
    REQUEST_IN_PROGRESS = "request_in_progress"  # same Idempotency-Key, still running
    REQUEST_TIMEOUT = "request_timeout"  # the client did not send its request in time
    # Not an API call at all (the gateway's HTTP edge).
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    TOO_MANY_CONNECTIONS = "too_many_connections"  # the gateway process's connection limit
    CLIENT_CONNECTIONS = "client_connections"  # one client address's connection limit
    # Nothing to serve it on.
    NO_REPLICA = "no_replica"
    REPLICA_LOST = "replica_lost"
    SCHEDULER_UNAVAILABLE = "scheduler_unavailable"
    ROUTER_UNAVAILABLE = "router_unavailable"
    LIMITS_UNAVAILABLE = "limits_unavailable"  # the gateway's limits store (Redis)
    LEDGER_UNAVAILABLE = "ledger_unavailable"  # the usage ledger (SQL)
    # A stream that outlived what it was allowed.
    SLOW_READER = "slow_reader"  # its reader fell too far behind (a client that stopped reading)
    DEADLINE_EXCEEDED = "deadline_exceeded"  # the request's own deadline passed while it ran
    # The caller went away; a bug or a failed step.
    CANCELLED = "cancelled"
    ENGINE_ERROR = "engine_error"
    INTERNAL_ERROR = "internal_error"


@dataclass(frozen=True, slots=True)
class Outcome:
    reason: Reason
    grpc_status: str  # a grpc.StatusCode name
    http_status: int
    retryable: bool


def _table() -> dict[Reason, Outcome]:
    rows = [
        (Reason.MISSING_API_KEY, "UNAUTHENTICATED", 401, False),
        (Reason.INVALID_API_KEY, "UNAUTHENTICATED", 401, False),
        (Reason.PERMISSION_DENIED, "PERMISSION_DENIED", 403, False),
        (Reason.RATE_LIMIT_EXCEEDED, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.TENANT_CONCURRENCY, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.TENANT_KV_SHARE, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.QUEUE_FULL, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.OVER_CAPACITY, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.QUEUE_TIMEOUT, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.BATCH_PAUSED, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.INVALID_REQUEST, "INVALID_ARGUMENT", 400, False),
        (Reason.INVALID_JSON, "INVALID_ARGUMENT", 400, False),
        (Reason.INVALID_IDEMPOTENCY_KEY, "INVALID_ARGUMENT", 400, False),
        (Reason.CONTEXT_LENGTH_EXCEEDED, "INVALID_ARGUMENT", 400, False),
        # gRPC has no "too large"; the table, not the status, says 413.
        (Reason.REQUEST_TOO_LARGE, "INVALID_ARGUMENT", 413, False),
        (Reason.MODEL_NOT_FOUND, "NOT_FOUND", 404, False),
        (Reason.DUPLICATE_REQUEST, "ALREADY_EXISTS", 409, False),
        # The first attempt under the key still runs: retry once it ended
        # (ABORTED is gRPC's "a concurrency conflict, retry at a higher level").
        (Reason.REQUEST_IN_PROGRESS, "ABORTED", 409, True),
        (Reason.REQUEST_TIMEOUT, "DEADLINE_EXCEEDED", 408, True),
        (Reason.NOT_FOUND, "NOT_FOUND", 404, False),
        (Reason.METHOD_NOT_ALLOWED, "UNIMPLEMENTED", 405, False),
        (Reason.TOO_MANY_CONNECTIONS, "UNAVAILABLE", 503, True),
        (Reason.CLIENT_CONNECTIONS, "RESOURCE_EXHAUSTED", 429, True),
        (Reason.NO_REPLICA, "UNAVAILABLE", 503, True),
        (Reason.REPLICA_LOST, "UNAVAILABLE", 503, True),
        (Reason.SCHEDULER_UNAVAILABLE, "UNAVAILABLE", 503, True),
        (Reason.ROUTER_UNAVAILABLE, "UNAVAILABLE", 503, True),
        (Reason.LIMITS_UNAVAILABLE, "UNAVAILABLE", 503, True),
        (Reason.LEDGER_UNAVAILABLE, "UNAVAILABLE", 503, True),
        # The caller stopped reading its stream: its own doing, so a 4xx, and
        # 408 is HTTP's "the client took too long" (to read here, as
        # request_timeout is to send). Not 429: nothing is contended, and a
        # Retry-After would send it back to be cut again. A retry that reads
        # may succeed.
        (Reason.SLOW_READER, "DEADLINE_EXCEEDED", 408, True),
        # GenerateRequest.deadline_unix_s passed before the stream finished:
        # gRPC's DEADLINE_EXCEEDED, which HTTP spells 504. Not retryable: the
        # same request carries the same, already past, deadline.
        (Reason.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", 504, False),
        (Reason.CANCELLED, "CANCELLED", 499, False),
        (Reason.ENGINE_ERROR, "INTERNAL", 500, True),
        (Reason.INTERNAL_ERROR, "INTERNAL", 500, False),
    ]
    table = {reason: Outcome(reason, status, http, retryable) for reason, status, http, retryable in rows}
    missing = set(Reason) - set(table)
    assert not missing, f"reasons without an outcome: {sorted(missing)}"
    return table


OUTCOMES: dict[Reason, Outcome] = _table()


def outcome_of(reason: str) -> Outcome | None:
    """The outcome of a reason a peer sent; None for a string not in the
    vocabulary (an older or newer peer), which callers map by status."""
    try:
        return OUTCOMES[Reason(reason)]
    except ValueError:
        return None
