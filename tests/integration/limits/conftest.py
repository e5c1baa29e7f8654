"""Fixtures for the limits suites: a fake clock, and a real Redis with a
key prefix of its own per test (deleted afterwards)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self, start_s: float = 1_000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


RedisSession = Callable[[], AbstractAsyncContextManager[tuple[Redis, str]]]


@pytest.fixture
def redis_session() -> RedisSession:
    """Opens (client, unique key prefix); closing deletes the prefix's keys.

    A factory rather than a plain fixture so that the in-process half of a
    parametrized suite neither needs nor touches Redis."""

    @asynccontextmanager
    async def open_session() -> AsyncIterator[tuple[Redis, str]]:
        client = Redis.from_url(REDIS_URL)
        try:
            await client.ping()
        except (RedisConnectionError, OSError) as exc:
            await client.aclose()
            pytest.skip(f"Redis not reachable at {REDIS_URL}: {exc}")
        prefix = f"sluice-test:{uuid.uuid4().hex}"
        try:
            yield client, prefix
        finally:
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()

    return open_session
