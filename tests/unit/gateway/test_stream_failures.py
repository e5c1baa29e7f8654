"""A stream that breaks after it started ends with an SSE error event whose
type and code follow the reason's outcome: a lost replica or a lost router
is a retryable 503-class `service_unavailable_error`, never a 500. A
stream's opening and closing frames share writes with their neighbours.

The gateway's real RouterClient talks to a fake Router (a grpc.aio server
on loopback that admits the request and then fails it the way the real
router does, in-band or by going away); the generation route runs in
Starlette under httpx's ASGI transport with in-process limits."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import grpc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from sluice.gateway.auth import Tenant
from sluice.gateway.background import BackgroundTasks
from sluice.gateway.front_door import FrontDoor
from sluice.gateway.metrics import GatewayMetrics
from sluice.gateway.router_client import RouterClient
from sluice.gateway.routes import generation
from sluice.gateway.settings import GatewaySettings
from sluice.gateway.state import GatewayState
from sluice.gateway.tenant_backoff import TenantBackoff
from sluice.limits import InProcessConcurrencyLimiter, InProcessIdempotencyStore, InProcessRateLimiter
from sluice.rpc.errors import ServiceError
from sluice.v1 import common_pb2, router_pb2, router_pb2_grpc

API_KEY = "sk-test"


class FakeRouter(router_pb2_grpc.RouterServicer):
    """Admits each request, sends one delta, then does what `then` says:
    "replica_lost" sends the router's in-band Error for a lost replica;
    "finish" ends the generation (length, 3 prompt and 1 output token);
    "hang" keeps the call open (the test stops the server: a lost router)."""

    def __init__(self, then: str) -> None:
        self.then = then
        self.streaming = asyncio.Event()
        self.received: list[router_pb2.GenerateRequest] = []

    async def GenerateMany(self, request_iterator, context):
        async for command in request_iterator:
            request_id = command.generate.request_id
            self.received.append(command.generate)
            yield router_pb2.GenerateEventBatch(events=[
                router_pb2.RoutedEvent(request_id=request_id, event=router_pb2.GenerateEvent(
                    admitted=router_pb2.Admitted(model_version="tiny@1", prompt_tokens=3, replica_id="r0"))),
                router_pb2.RoutedEvent(request_id=request_id, event=router_pb2.GenerateEvent(
                    delta=router_pb2.Delta(text="Hel", token_ids=[1]))),
            ])
            if self.then == "finish":
                yield router_pb2.GenerateEventBatch(events=[router_pb2.RoutedEvent(
                    request_id=request_id, event=router_pb2.GenerateEvent(finished=router_pb2.Finished(
                        finish_reason=common_pb2.FINISH_REASON_LENGTH,
                        usage=common_pb2.Usage(prompt_tokens=3, output_tokens=1))))])
            elif self.then == "replica_lost":
                yield router_pb2.GenerateEventBatch(events=[router_pb2.RoutedEvent(
                    request_id=request_id, event=router_pb2.GenerateEvent(error=router_pb2.Error(
                        code="replica_lost", message="the model replica failed: the peer ended the stream")))])
            else:
                self.streaming.set()
                await asyncio.Event().wait()


class Keys:
    def tenant_for(self, api_key: str) -> Tenant | None:
        return Tenant("acme") if api_key == API_KEY else None


class Outbox:
    def __init__(self) -> None:
        self.records = []

    def append(self, record) -> None:
        self.records.append(record)


class Harness:
    def __init__(self, then: str) -> None:
        self.router = FakeRouter(then)
        self.server = grpc.aio.server()
        router_pb2_grpc.add_RouterServicer_to_server(self.router, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def __aenter__(self) -> Harness:
        await self.server.start()
        settings = GatewaySettings()
        resources = SimpleNamespace(
            rate_limiter=InProcessRateLimiter(), concurrency=InProcessConcurrencyLimiter(),
            idempotency=InProcessIdempotencyStore(), outbox=Outbox(),
        )
        self.client = RouterClient(f"127.0.0.1:{self.port}")
        self.background = BackgroundTasks()
        self.resources = resources
        app = Starlette(routes=[Route("/v1/chat/completions", generation.chat_completions, methods=["POST"])])
        app.state.gateway = GatewayState(
            settings=settings, router=self.client, authenticator=Keys(), metrics=GatewayMetrics.create(),
            resources=resources, front_door=FrontDoor(resources, settings), background=self.background,
            backoff=TenantBackoff(),
        )
        self.metrics = app.state.gateway.metrics
        self.sent: list[dict] = []  # every ASGI message the app sent, in order

        async def recording(scope, receive, send):
            async def record(message):
                self.sent.append(message)
                await send(message)
            await app(scope, receive, record)

        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=recording), base_url="http://gateway")
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()
        await self.background.drain(timeout_s=5)
        await self.client.close()
        await self.server.stop(0)

    async def streaming_started(self) -> None:
        """Wait until the gateway relays an admitted stream (its SSE body runs)."""
        while self.metrics.registry.get_sample_value("sluice_gateway_streams_active") != 1:
            await asyncio.sleep(0.01)

    def body_writes(self) -> list[tuple[bytes, bool]]:
        """(body, more_body) of each response body message: one write each."""
        return [(m["body"], m.get("more_body", False)) for m in self.sent if m["type"] == "http.response.body"]

    def chat(self, stream: bool, idempotency_key: str | None = None, **body):
        headers = {"Authorization": f"Bearer {API_KEY}"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return self.http.post(
            "/v1/chat/completions", headers=headers,
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream, **body},
            timeout=10,
        )


def sse_payloads(body: str) -> list:
    lines = [line.removeprefix("data: ") for line in body.split("\n") if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


async def test_a_lost_replica_mid_stream_is_a_503_class_error_event():
    async with Harness("replica_lost") as harness:
        response = await harness.chat(stream=True)
        assert response.status_code == 200  # the stream had started
        payloads = sse_payloads(response.text)
        assert payloads[-1] == "[DONE]"
        error = payloads[-2]["error"]
        assert (error["type"], error["code"]) == ("service_unavailable_error", "replica_lost")
        assert "replica" in error["message"]
        # The attempt is recorded unbilled, as failed.
        await harness.background.drain(timeout_s=5)
        assert [r.outcome for r in harness.resources.outbox.records] == ["error"]


async def test_a_short_answer_is_three_writes_the_role_with_the_first_token_and_the_end_with_the_body_end():
    """Each write is a send on the client's socket and a wake-up of its
    reader: the opening role chunk waits for the first token's frame, and
    the finish chunk, the usage chunk and [DONE] end the body in one write."""
    async with Harness("finish") as harness:
        response = await harness.chat(stream=True, stream_options={"include_usage": True})
        assert response.status_code == 200
        payloads = sse_payloads(response.text)
        assert [p if p == "[DONE]" else (p["choices"][0] if p["choices"] else "usage") for p in payloads] == [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
            {"index": 0, "delta": {"content": "Hel"}, "logprobs": None, "finish_reason": None},
            {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"},
            "usage", "[DONE]"]
        writes = harness.body_writes()
        assert len(writes) == 2, writes
        (opening, more), (closing, last_more) = writes
        assert more and not last_more
        assert [p["choices"][0]["delta"] for p in sse_payloads(opening.decode())] == [
            {"role": "assistant", "content": ""}, {"content": "Hel"}]
        assert sse_payloads(closing.decode())[-1] == "[DONE]" and len(sse_payloads(closing.decode())) == 3
        assert b"".join(body for body, _ in writes).decode() == response.text


async def test_a_stream_that_fails_ends_its_body_with_the_error_and_done_in_one_write():
    async with Harness("replica_lost") as harness:
        response = await harness.chat(stream=True)
        *_, (closing, more) = harness.body_writes()
        assert not more
        error, done = sse_payloads(closing.decode())
        assert (error["error"]["code"], done) == ("replica_lost", "[DONE]")
        assert response.text.endswith(closing.decode())


async def test_a_lost_replica_before_a_collected_body_is_a_503_with_retry_headers():
    async with Harness("replica_lost") as harness:
        response = await harness.chat(stream=False)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "replica_lost"
        assert response.headers["retry-after"] == "1" and response.headers["retry-after-ms"] == "1000"
        assert response.headers["x-sluice-reject-reason"] == "replica_lost"


async def test_a_router_that_goes_away_mid_stream_is_router_unavailable():
    async with Harness("hang") as harness:
        request = asyncio.create_task(harness.chat(stream=True))
        await asyncio.wait_for(harness.streaming_started(), timeout=5)
        await harness.server.stop(0)  # the router process dies mid-stream
        response = await asyncio.wait_for(request, timeout=10)
        assert response.status_code == 200
        payloads = sse_payloads(response.text)
        assert payloads[-1] == "[DONE]"
        error = payloads[-2]["error"]
        assert (error["type"], error["code"]) == ("service_unavailable_error", "router_unavailable")


async def test_the_router_session_fails_its_requests_with_router_unavailable():
    async with Harness("hang") as harness:
        opened = await harness.client.open_stream(router_pb2.GenerateRequest(request_id="r1", model="tiny"))
        assert opened.first_event.WhichOneof("event") == "admitted"
        await harness.router.streaming.wait()
        await harness.server.stop(0)
        with pytest.raises(ServiceError) as lost:
            async for _ in opened.rest:
                pass
        assert (lost.value.info.status, lost.value.info.reason) == (grpc.StatusCode.UNAVAILABLE, "router_unavailable")


async def test_a_retry_after_a_failed_attempt_carries_the_same_affinity_key():
    """Each attempt has its own request id, but the router picks the version
    by the Idempotency-Key, so a retry lands where the first try did."""
    async with Harness("replica_lost") as harness:
        for _ in range(2):
            assert (await harness.chat(stream=False, idempotency_key="order-7")).status_code == 503
            await harness.background.drain(timeout_s=5)  # the failed attempt released its key
        await harness.chat(stream=False)
        first, retry, unkeyed = harness.router.received
        assert first.request_id != retry.request_id
        assert first.affinity_key == retry.affinity_key == "order-7"
        assert unkeyed.affinity_key == ""
