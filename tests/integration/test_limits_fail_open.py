"""The limits store fails open on the real processes: the gateway reaches the
real Redis through a TCP proxy that the test cuts (as a Redis outage looks
from the gateway: refused connections). Requests keep being served with
this gateway's share of each limit, the fallback metric says so, an
Idempotency-Key still bills once, and the shared limits take over again
when Redis is back."""

import asyncio
import threading
import time
import uuid

import httpx
import pytest

from integration.conftest import eventually
from integration.test_keys_usage_limits import create_key
from sluice.devstack.stack import LocalStack, StackPorts
from sluice.gateway.replay import REPLAY_HEADER

REPLAY_HEADER_NAME = next(iter(REPLAY_HEADER))

pytestmark = pytest.mark.stack

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
FALLBACK_GATEWAYS = 2
RETRY_INTERVAL_S = 0.5


class TcpProxy:
    """Forwards a local port to Redis on a thread of its own; `cut()` closes
    the listener and every open connection, `resume()` listens again on the
    same port."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_reader, client_writer) -> None:
        redis_reader, redis_writer = await asyncio.open_connection(REDIS_HOST, REDIS_PORT)
        self.writers |= {client_writer, redis_writer}
        await asyncio.gather(self._pipe(client_reader, redis_writer), self._pipe(redis_reader, client_writer))

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()
        await self.server.wait_closed()

    def resume(self) -> None:
        self._run(self._listen())

    def cut(self) -> None:
        self._run(self._cut())

    def close(self) -> None:
        if self.server is not None and self.server.is_serving():
            self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def proxy():
    p = TcpProxy()
    p.resume()
    yield p
    p.close()


@pytest.fixture(scope="module")
def failing_open(tiny_model_dir, tmp_path_factory, proxy, stack_database_url):
    log_dir = tmp_path_factory.mktemp("fail-open-logs")
    stack = LocalStack(
        model_dir=tiny_model_dir, log_dir=log_dir, ports=StackPorts.ephemeral(),
        cwd=tmp_path_factory.mktemp("fail-open-cwd"),
        extra_env={
            "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0",
            "SLUICE_REDIS_KEY_PREFIX": f"sluice-failopen-{uuid.uuid4().hex[:8]}",
            "SLUICE_DATABASE_URL": stack_database_url,
            "SLUICE_OUTBOX_PATH": str(log_dir / "outbox.db"),
            "SLUICE_LIMITS_FALLBACK_GATEWAYS": str(FALLBACK_GATEWAYS),
            "SLUICE_LIMITS_RETRY_INTERVAL_S": str(RETRY_INTERVAL_S),
            "SLUICE_CANARY_INTERVAL_S": "1",
        },
    )
    with stack.running(timeout_s=180):
        yield stack


def _fallback(stack) -> float:
    text = httpx.get(stack.gateway_url + "/metrics", timeout=5.0).text
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("sluice_gateway_limits_fallback "))


def _chat(stack, key: str, sent: list[httpx.Response], idempotency_key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    response = httpx.post(stack.gateway_url + "/v1/chat/completions", timeout=60.0, headers=headers, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "ignore_eos": True})
    sent.append(response)
    return response


def test_redis_away_means_served_with_this_gateways_share_and_billed_once(failing_open, proxy, stack_database_url):
    tenant = f"fo-{uuid.uuid4().hex[:8]}"
    key = create_key(stack_database_url, tenant, "--requests-per-minute", "100")
    sent: list[httpx.Response] = []
    eventually(lambda: _chat(failing_open, key, sent).status_code == 200, timeout_s=10)
    response = _chat(failing_open, key, sent)
    assert response.headers["x-ratelimit-limit-requests"] == "100" and _fallback(failing_open) == 0

    proxy.cut()
    try:
        served = [_chat(failing_open, key, sent, idempotency_key=f"k-{i}") for i in range(4)]
        assert [r.status_code for r in served] == [200] * 4, [r.text for r in served]
        assert served[-1].headers["x-ratelimit-limit-requests"] == str(100 // FALLBACK_GATEWAYS)
        assert _fallback(failing_open) == 1
        replay = _chat(failing_open, key, sent, idempotency_key="k-0")  # a retry while Redis is away
        assert replay.status_code == 200 and replay.json()["id"] == served[0].json()["id"]
        assert REPLAY_HEADER_NAME in replay.headers
    finally:
        proxy.resume()
    time.sleep(RETRY_INTERVAL_S)
    eventually(lambda: _chat(failing_open, key, sent).headers.get("x-ratelimit-limit-requests") == "100",
               timeout_s=10)
    assert _fallback(failing_open) == 0
    assert all(r.status_code < 500 for r in sent)

    # Every served answer billed once; the replay not again.
    expected = sum(r.status_code == 200 and REPLAY_HEADER_NAME not in r.headers for r in sent)

    def billed() -> int:
        usage = httpx.get(failing_open.gateway_url + "/v1/usage", headers={"Authorization": f"Bearer {key}"},
                          timeout=10.0).json()
        return sum(bucket["requests"] for bucket in usage["data"])
    eventually(lambda: billed() == expected, timeout_s=10)
