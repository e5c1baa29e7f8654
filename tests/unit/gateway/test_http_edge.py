"""The gateway's HTTP edge (uvicorn's httptools protocol with limits) on a
real uvicorn server on loopback: connection limits answered in OpenAI's
error shape with Retry-After, headers that never finish answered 408, a
request head over its bound and malformed HTTP answered 400 in JSON; and
the catch-all's 500 for an unexpected error."""

import asyncio
import contextlib
import json
import logging
import socket
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from sluice.gateway.catch_all import REQUEST_ID_HEADER, CatchAll
from sluice.gateway.http_edge import EdgeLimits, edge_protocol


async def _ok(request):
    return PlainTextResponse("ok")


async def _boom(request):
    raise RuntimeError("a bug, with the secret prompt text in no log")


async def _body_size(request):
    return PlainTextResponse(str(len(await request.body())))


async def _early(request):
    return PlainTextResponse("early")  # answers before reading the body (as a 401 or a 413 does)


STREAM_CLOSED = asyncio.Event()


async def _endless(request):
    async def chunks():
        try:
            while True:
                await asyncio.sleep(0)  # a real stream awaits its next event
                yield b"x" * 65536
        finally:
            STREAM_CLOSED.set()  # the generator was closed: the stream's cleanup ran
    return StreamingResponse(chunks())


APP = Starlette(routes=[Route("/", _ok), Route("/boom", _boom), Route("/endless", _endless),
                        Route("/size", _body_size, methods=["POST"]), Route("/early", _early, methods=["POST"])],
                middleware=[Middleware(CatchAll)])


@contextlib.asynccontextmanager
async def serving(limits: EdgeLimits):
    config = uvicorn.Config(APP, host="127.0.0.1", port=0, http=edge_protocol(limits), log_level="warning",
                            lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10.0)


async def _exchange(port: int, data: bytes = b"", wait_s: float = 5.0) -> bytes:
    """Send `data`, read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if data:
            writer.write(data)
            await writer.drain()
        return await asyncio.wait_for(reader.read(), wait_s)
    finally:
        writer.close()


def _error(response: bytes) -> tuple[int, dict, bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"], head.lower()


LIMITS = EdgeLimits(header_timeout_s=0.5, max_connections=0, max_connections_per_client=0)


async def test_a_connection_past_the_per_client_limit_gets_429_with_retry_after():
    limits = EdgeLimits(header_timeout_s=5.0, max_connections=0, max_connections_per_client=2)
    async with serving(limits) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        status, error, head = _error(await _exchange(port))
        assert status == 429 and error["code"] == "client_connections" and error["type"] == "rate_limit_error"
        assert b"retry-after: 1" in head and b"retry-after-ms: 1000" in head
        assert limits.closes["client_connections"] == 1
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient() as client:  # room again once they closed
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "ok"


async def test_a_connection_past_the_process_limit_gets_503():
    async with serving(EdgeLimits(header_timeout_s=5.0, max_connections=1, max_connections_per_client=0)) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        status, error, head = _error(await _exchange(port))
        assert status == 503 and error["code"] == "too_many_connections"
        assert b"retry-after:" in head
        writer.close()


async def test_headers_that_never_finish_get_408_then_close():
    limits = EdgeLimits(header_timeout_s=0.5, max_connections=0, max_connections_per_client=0)
    async with serving(limits) as port:
        status, error, _ = _error(await _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n"))
        assert status == 408 and error["code"] == "request_timeout"
        assert await _exchange(port) == b""  # nothing sent at all: closed without an answer
    assert limits.closes["header_timeout"] == 2


def test_the_edges_counts_are_a_metric():
    from prometheus_client import generate_latest

    from sluice.gateway.metrics import GatewayMetrics

    limits = EdgeLimits(header_timeout_s=1.0, max_connections=0, max_connections_per_client=0)
    limits.closes["write_timeout"] += 3
    page = generate_latest(GatewayMetrics.create(limits.closes).registry).decode()
    assert 'sluice_gateway_http_edge_closes_total{reason="write_timeout"} 3.0' in page
    assert 'sluice_gateway_http_edge_closes_total{reason="header_timeout"} 0.0' in page


async def test_a_kept_alive_connection_is_timed_again_for_its_next_request():
    async with serving(LIMITS) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b"ok"), 5.0)
        assert first.startswith(b"HTTP/1.1 200")
        writer.write(b"GET / HTTP/1.1\r\n")  # the next request never finishes its headers
        rest = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        assert rest.startswith(b"HTTP/1.1 408")


async def test_malformed_http_is_a_json_400():
    async with serving(LIMITS) as port:
        status, error, head = _error(await _exchange(port, b"NOT HTTP AT ALL\r\n\r\n"))
        assert status == 400 and error["type"] == "invalid_request_error" and b"application/json" in head


async def test_an_unexpected_error_is_one_log_line_and_a_500_naming_a_request_id(caplog):
    caplog.set_level(logging.ERROR)
    async with serving(LIMITS) as port:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/boom")
    assert response.status_code == 500
    error = response.json()["error"]
    request_id = response.headers[REQUEST_ID_HEADER]
    assert error["type"] == "server_error" and error["code"] == "internal_error" and request_id in error["message"]
    records = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(records) == 1 and request_id in records[0].getMessage()


async def test_a_request_head_over_the_bound_is_a_json_400():
    limits = EdgeLimits(header_timeout_s=5.0, max_connections=0, max_connections_per_client=0, max_header_bytes=1024)
    async with serving(limits) as port:
        head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 1100 + b"\r\n\r\n"
        status, error, _ = _error(await _exchange(port, head))
        assert status == 400 and error["type"] == "invalid_request_error"
        assert "over 1024 bytes" in error["message"]
        # Just under the bound is served.
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/", headers={"X-Filler": "a" * 700})
            assert response.text == "ok"
    assert limits.closes["malformed"] == 1


async def test_a_header_line_that_never_ends_is_a_json_400_once_over_the_bound():
    limits = EdgeLimits(header_timeout_s=5.0, max_connections=0, max_connections_per_client=0, max_header_bytes=1024)
    async with serving(limits) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Filler: aaaa")
        await writer.drain()
        await asyncio.sleep(0.05)
        for _ in range(3):  # no line end: the parser reaches no header callback
            writer.write(b"a" * 600)
            await writer.drain()
            await asyncio.sleep(0.05)
        status, error, _ = _error(await asyncio.wait_for(reader.read(), 5.0))
        writer.close()
    assert status == 400 and "over 1024 bytes" in error["message"]


async def test_a_body_still_arriving_after_an_early_answer_is_not_timed_as_a_head():
    async with serving(LIMITS) as port:  # header timeout 0.5 s
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
        first = await asyncio.wait_for(reader.readuntil(b"early"), 5.0)
        assert first.startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0.3)
        writer.write(b"01234")  # more of the body, after its answer
        await asyncio.sleep(0.8)  # past the header timeout
        writer.write(b"56789")  # the body is complete
        await asyncio.sleep(0.8)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # the connection still serves
        second = await asyncio.wait_for(reader.readuntil(b"ok"), 5.0)
        writer.close()
    assert second.startswith(b"HTTP/1.1 200")


async def test_a_body_that_arrives_with_its_head_does_not_count_as_head():
    limits = EdgeLimits(header_timeout_s=5.0, max_connections=0, max_connections_per_client=0, max_header_bytes=1024)
    async with serving(limits) as port:
        body = b"b" * 65536
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /size HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        answer = await asyncio.wait_for(reader.readuntil(b"65536"), 5.0)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200")


async def test_pipelined_requests_are_answered_in_order_and_not_timed_as_heads():
    async with serving(LIMITS) as port:  # header timeout 0.5 s
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /size HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                     b"POST /size HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde")
        answers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n5"), 5.0)
        assert answers.count(b"HTTP/1.1 200") == 2 and answers.index(b"\r\n\r\n3") < answers.index(b"\r\n\r\n5")
        await asyncio.sleep(1.0)  # past the header timeout: an idle kept-alive connection is not a slow head
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        third = await asyncio.wait_for(reader.readuntil(b"ok"), 5.0)
        writer.close()
    assert third.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("limits", [LIMITS])
async def test_ordinary_requests_pass(limits):
    async with serving(limits) as port:
        async with httpx.AsyncClient() as client:
            for _ in range(3):  # one kept-alive connection
                assert (await client.get(f"http://127.0.0.1:{port}/")).text == "ok"


async def test_a_client_that_stops_reading_is_disconnected_after_the_write_timeout():
    STREAM_CLOSED.clear()
    limits = EdgeLimits(header_timeout_s=5.0, max_connections=0, max_connections_per_client=0, write_timeout_s=0.5)
    async with serving(limits) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        await asyncio.wait_for(STREAM_CLOSED.wait(), 10.0)
        sock.setblocking(False)
        # The abort reaches the socket after the generator closed, behind
        # whatever the kernel buffered: drain until EOF or reset.
        closed, deadline = False, time.monotonic() + 10.0
        while not closed and time.monotonic() < deadline:
            try:
                closed = not sock.recv(1 << 20)  # b"" = EOF
            except BlockingIOError:
                await asyncio.sleep(0.05)
            except ConnectionResetError:
                closed = True  # aborted
        sock.close()
        assert closed
