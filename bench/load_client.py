"""A lean HTTP/1.1 load client for the cluster benchmarks.

The benchmarks run the load client on the same two cores as the stack it
measures, so whatever the client spends per request is taken from the
services and shows up in their latency. httpx (with httpcore and anyio
under it) spent ~1.4 ms of CPU on each request a flood had refused, more
than the gateway spent refusing it (~0.8 ms), and more again per streamed
chunk; a quiet tenant's timings then carried the flood's client work, not
only the stack's. This client is an asyncio Protocol over one keep-alive
connection with httptools' C parser (already the gateway's): the bytes of
a request are written in one call, and a response's body is handed to a
callback as it is parsed, on the event loop's read of the socket, so no
task switch sits between a chunk's arrival and its timestamp.

    client = LoadClient("127.0.0.1", 8080)
    response = await client.post("/v1/chat/completions", body_bytes, headers, on_body=handle)
    response.status, response.headers["retry-after"]
    await response.finished       # the whole body was handed to on_body
    client.close()

Only what the benchmarks send: POST with a body, a response with a
Content-Length or chunked body. Cancelling a request closes its connection
(the server sees the client leave); a connection is reused only after a
complete response that allows keep-alive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import httptools


class ConnectionFailed(ConnectionError):
    """The connection broke or the response could not be parsed."""


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    finished: asyncio.Future = field(repr=False)  # done when the body is all in (or failed)


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.open = True
        self._headers: dict[str, str] = {}
        self._answered: asyncio.Future | None = None  # -> Response, at the end of the head
        self._finished: asyncio.Future | None = None
        self._on_body: Callable[[bytes], None] | None = None
        self.reusable = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # not something the gateway answers
            self._fail(ConnectionFailed("unexpected upgrade"))
        except httptools.HttpParserError as error:
            self._fail(ConnectionFailed(f"bad response: {error}"))
        except BaseException as error:  # an on_body callback failed: the exchange ends with it
            self._fail(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail(ConnectionFailed(f"connection lost: {exc}" if exc else "connection closed by the server"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._answered is not None and not self._answered.done():
            self._answered.set_result(Response(self.parser.get_status_code(), self._headers, self._finished))

    def on_body(self, body: bytes) -> None:
        if self._on_body is not None:
            self._on_body(body)

    def on_message_complete(self) -> None:
        self.reusable = self.open and self.parser.should_keep_alive()
        finished, self._finished, self._answered, self._on_body = self._finished, None, None, None
        if finished is not None and not finished.done():
            finished.set_result(None)

    # the exchange
    def send(self, request: bytes, on_body: Callable[[bytes], None] | None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        self.reusable = False
        self._answered, self._finished, self._on_body = loop.create_future(), loop.create_future(), on_body
        self.transport.write(request)
        return self._answered

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: BaseException) -> None:
        for future in (self._answered, self._finished):
            if future is not None and not future.done():
                future.set_exception(error)
        if self._finished is not None and not self._finished.cancelled():
            self._finished.exception()  # retrieved: nobody may await `finished` after a failed head
        self._answered = self._finished = self._on_body = None
        self.close()


class LoadClient:
    """Keep-alive connections to one server, opened as requests need them
    (an idle one is reused first). Plain HTTP on loopback only."""

    def __init__(self, host: str, port: int, *, connect_timeout_s: float = 10.0) -> None:
        self.host, self.port = host, port
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._host_header = f"{host}:{port}".encode()

    async def post(self, path: str, body: bytes, headers: dict[str, str],
                   on_body: Callable[[bytes], None] | None = None) -> Response:
        """Send a POST; return at the end of the response's head. The body
        goes to `on_body` piece by piece; `Response.finished` completes with
        it. Cancelled before the body is all in, the connection is closed."""
        connection = await self._acquire()
        head = [b"POST ", path.encode(), b" HTTP/1.1\r\nHost: ", self._host_header,
                b"\r\nContent-Type: application/json\r\nContent-Length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers.items():
            head += [name.encode(), b": ", value.encode(), b"\r\n"]
        head += [b"\r\n", body]
        try:
            response: Response = await connection.send(b"".join(head), on_body)
        except BaseException:
            self._drop(connection)
            raise
        if response.finished.done():  # the whole response came with its head
            self._release(connection, response.finished)
        else:  # registered before the caller awaits `finished`, so it runs first
            response.finished.add_done_callback(lambda done: self._release(connection, done))
        return response

    def close(self) -> None:
        for connection in list(self._open):
            self._drop(connection)
        self._idle.clear()

    async def _acquire(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.open:
                return connection
            self._open.discard(connection)
        loop = asyncio.get_running_loop()
        _, connection = await asyncio.wait_for(
            loop.create_connection(_Connection, self.host, self.port), self.connect_timeout_s)
        self._open.add(connection)
        return connection

    def _release(self, connection: _Connection, finished: asyncio.Future) -> None:
        if finished.cancelled() or finished.exception() is not None or not connection.reusable:
            self._drop(connection)
        else:
            self._idle.append(connection)

    def _drop(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

