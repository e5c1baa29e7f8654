"""The gateway's stateful collaborators, built from settings at start-up.

Redis when REDIS_URL is set (any number of gateways share buckets and
idempotency keys), in-process otherwise (`make run` on a laptop). The ledger
is Postgres or SQLite behind a durable local outbox drained by a thread.
"""

import asyncio
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from sluice.gateway.settings import GatewaySettings
from sluice.ledger import KeyStore, LedgerStore, Outbox, OutboxFlusher, resolve_database_url, upgrade_database
from sluice.limits.fail_open import (
    FailOpenConcurrencyLimiter,
    FailOpenIdempotencyStore,
    FailOpenRateLimiter,
    StoreHealth,
)
from sluice.limits import (
    ConcurrencyLimiter,
    IdempotencyStore,
    InProcessConcurrencyLimiter,
    InProcessIdempotencyStore,
    InProcessRateLimiter,
    RateLimiter,
    RedisConcurrencyLimiter,
    RedisIdempotencyStore,
    RedisRateLimiter,
)

log = logging.getLogger(__name__)


@dataclass
class GatewayResources:
    rate_limiter: RateLimiter
    concurrency: ConcurrencyLimiter
    idempotency: IdempotencyStore
    ledger: LedgerStore
    keys: KeyStore
    outbox: Outbox
    flusher: OutboxFlusher
    redis: aioredis.Redis | None
    _flusher_stop: threading.Event
    _flusher_thread: threading.Thread
    limits_health: StoreHealth | None = None  # None: no shared store (in-process limits)

    @classmethod
    async def open(cls, settings: GatewaySettings) -> "GatewayResources":
        url = settings.database_url or resolve_database_url({}, Path.cwd())
        await asyncio.to_thread(upgrade_database, url)
        ledger = LedgerStore(url)
        outbox_path = Path(settings.outbox_path)
        outbox_path.parent.mkdir(parents=True, exist_ok=True)
        outbox = Outbox(outbox_path)
        flusher = OutboxFlusher(outbox, ledger)
        stop = threading.Event()
        thread = threading.Thread(target=flusher.run_forever, args=(stop,), name="ledger-outbox", daemon=True)
        thread.start()
        health = None
        if settings.redis_url:
            # Bounded waits: a Redis that drops packets must not hang
            # requests; when it fails, the limits fail open (fail_open.py).
            client = aioredis.from_url(settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
            prefix = settings.redis_key_prefix
            health = StoreHealth(retry_interval_s=settings.limits_retry_interval_s)
            share = 1.0 / settings.limits_fallback_gateways
            limiter, concurrency, idempotency = (
                FailOpenRateLimiter(RedisRateLimiter(client, key_prefix=prefix), InProcessRateLimiter(), share,
                                    health),
                FailOpenConcurrencyLimiter(RedisConcurrencyLimiter(client, key_prefix=prefix),
                                           InProcessConcurrencyLimiter(), share, health),
                FailOpenIdempotencyStore(RedisIdempotencyStore(client, key_prefix=prefix),
                                         InProcessIdempotencyStore(), health),
            )
        else:
            client = None
            limiter, concurrency, idempotency = (
                InProcessRateLimiter(), InProcessConcurrencyLimiter(), InProcessIdempotencyStore()
            )
        log.info("ledger %s; limits in %s", url.split("@")[-1], "redis" if client else "process")
        return cls(limiter, concurrency, idempotency, ledger, KeyStore(ledger), outbox, flusher, client, stop, thread,
                   health)

    async def close(self) -> None:
        self._flusher_stop.set()
        await asyncio.to_thread(self._flusher_thread.join, 10.0)
        self.outbox.close()
        self.ledger.close()
        if self.redis is not None:
            await self.redis.aclose()
