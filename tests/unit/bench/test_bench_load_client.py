"""The cluster benchmarks' load client (bench/load_client.py) and the
harness's stream_chat over it, against a loopback server that answers with
the gateway's shapes: the benchmarks' figures are only as good as what the
client reads and when it stamps it."""

import asyncio
import contextlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from cluster_harness import stream_chat  # noqa: E402
from load_client import ConnectionFailed, LoadClient  # noqa: E402


def _event(count: int, *, choices: bool = True) -> bytes:
    event = {"choices": [{"delta": {"content": "x"}}] if choices else [],
             "usage": {"prompt_tokens": 7, "completion_tokens": count}}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Server:
    """Reads one request head and body at a time; `answer(writer, n)` writes
    the n-th response on a connection. Records connections and requests."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                await self.answer(writer, served)
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(answer):
    """(the server, a LoadClient to it, its listener), all closed after."""
    server = Server(answer)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    client = LoadClient("127.0.0.1", listener.sockets[0].getsockname()[1])
    try:
        yield server, client, listener
    finally:
        client.close()
        listener.close()


async def _stream(writer: asyncio.StreamWriter, _: int) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    body = _event(1) + _event(2) + _event(3) + _event(3, choices=False) + b"data: [DONE]\n\n"
    # Split mid-line and across chunks, as TCP may deliver it.
    for piece in (body[:10], body[10:150], body[150:]):
        writer.write(_chunk(piece))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(b"0\r\n\r\n")


async def test_stream_chat_reads_every_token_step_and_reuses_the_connection():
    async with serving(_stream) as (server, client, _):
        first = await stream_chat(client, "key-1", "tenant-a", "hello", max_tokens=3)
        second = await stream_chat(client, "key-1", "tenant-a", "hello", max_tokens=3)
    for record in (first, second):
        assert (record.status, record.error, record.finished) == (200, None, True)
        assert record.token_counts == [1, 2, 3]
        assert record.prompt_tokens == 7 and record.output_tokens == 3
        assert record.sent_s <= record.answered_s <= record.token_times_s[0] <= record.token_times_s[-1]
    assert server.connections == 1  # keep-alive: the second request went over the first connection
    head, body = server.requests[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer key-1" in head
    assert json.loads(body)["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def _refuse(writer: asyncio.StreamWriter, _: int) -> None:
    body = b'{"error": {"code": "tenant_kv_share"}}'
    writer.write(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\nretry-after-ms: 1250\r\n"
                 b"x-sluice-reject-reason: tenant_kv_share\r\ncontent-length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)


async def test_a_refusal_keeps_its_status_reason_and_advice():
    async with serving(_refuse) as (server, client, _):
        record = await stream_chat(client, "key", "tenant-a", "hello", max_tokens=3)
        again = await stream_chat(client, "key", "tenant-a", "hello", max_tokens=3)
    assert (record.status, record.reject_reason, record.retry_after_s, record.retry_after_ms) == (
        429, "tenant_kv_share", 2.0, 1250.0)
    assert record.refused and record.suggested_retry_s() == 1.25 and record.token_counts == []
    assert again.status == 429 and server.connections == 1


async def _hang_up_mid_body(writer: asyncio.StreamWriter, _: int) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunk(_event(1)))
    await writer.drain()
    writer.close()


async def test_a_connection_lost_mid_stream_is_an_error_in_the_record_not_an_exception():
    async with serving(_hang_up_mid_body) as (_, client, listener):
        record = await stream_chat(client, "key", "tenant-a", "hello", max_tokens=3)
        listener.close()
        await listener.wait_closed()
        refused = await stream_chat(client, "key", "tenant-a", "hello", max_tokens=3)  # nothing listens now
    assert record.status == 200 and record.token_counts == [1]
    assert not record.finished and "ConnectionFailed" in record.error
    assert refused.status is None and refused.error  # connection refused


async def _never_finish(writer: asyncio.StreamWriter, _: int) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunk(_event(1)))


async def test_cancelling_a_stream_closes_its_connection_so_the_server_sees_the_client_leave():
    sink = []
    async with serving(_never_finish) as (server, client, _):
        task = asyncio.ensure_future(stream_chat(client, "key", "tenant-a", "hello", max_tokens=3, sink=sink))
        for _ in range(200):
            if sink and sink[0].token_counts:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.closed.wait(), 5.0)
    assert sink[0].cancelled and sink[0].token_counts == [1]


async def test_a_response_that_is_not_http_fails_the_request():
    async def garbage(writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(b"SMTP ready\r\n\r\n")

    async with serving(garbage) as (_, client, _listener):
        with pytest.raises(ConnectionFailed):
            await client.post("/v1/chat/completions", b"{}", {})
