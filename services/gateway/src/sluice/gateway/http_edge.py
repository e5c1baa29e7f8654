"""Limits at the HTTP server, below the ASGI app: what uvicorn does not do.

The gateway speaks HTTP/1.1 through uvicorn's httptools protocol (the C
parser, llhttp): under the peer benchmark's load the pure-Python h11
protocol was a quarter of the gateway's CPU per streamed token, and nearly
half of what a refusal costs (a flood far over its limits is answered
here, request after request). uvicorn has a keep-alive timeout, but no
timeout for a request that never finishes its headers (a slowloris
connection costs its sender nothing and is held for ever), no bound on the
request head with this parser, no bound on connections per client address,
and it answers malformed HTTP and its own concurrency limit in plain text.
`edge_protocol(limits)` is uvicorn's httptools protocol with those added:

    connection accepted ── over max_connections ───────────▶ 503 JSON, closed
                       └── over max_connections_per_client ▶ 429 JSON, closed
    request headers not complete within header_timeout_s ──▶ 408 JSON, closed
    (bytes received; an idle connection is just closed)
    request line and headers over max_header_bytes ────────▶ 400 JSON, closed
    a response the client stops reading, for write_timeout_s ▶ connection aborted
    (the app sees a disconnect: its stream is cancelled upstream, its slot freed)
    malformed request line or headers ─────────────────────▶ 400 JSON

Answers are the app's own ApiError answers (OpenAI's error shape,
Retry-After where a retry helps), written as raw HTTP/1.1 since no request
exists yet to answer through the app. The body read timeout is the app's
(schemas.read_json_body): by then a request exists and its answer goes
through the app.

Behind a proxy every connection comes from the proxy's address: set
max_connections_per_client to 0 there and limit per client at the proxy.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sluice.gateway.errors import ApiError
from sluice.outcomes import Reason

log = logging.getLogger(__name__)

# What the edge counts (sluice_gateway_http_edge_closes_total{reason}).
EDGE_REASONS = ("too_many_connections", "client_connections", "header_timeout", "write_timeout", "malformed")
# What each header line adds to the head besides its name and value (": " and CRLF).
HEADER_LINE_OVERHEAD_BYTES = 4


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    header_timeout_s: float
    max_connections: int  # per process; 0 = no limit
    max_connections_per_client: int  # per client address; 0 = no limit
    retry_after_s: int = 1  # on a 429 or 503 for too many connections
    write_timeout_s: float = 60.0  # a paused write (the client reads nothing) for this long aborts
    max_header_bytes: int = 16 * 1024  # request line and headers of one request
    # Connections refused or closed by these limits, by EDGE_REASONS; the
    # protocol (on the event loop) writes it, the metrics page reads it.
    closes: Counter = field(default_factory=Counter)


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the parser stops and uvicorn answers 400."""


def error_response(reason: Reason, message: str, retry_after_s: int | None = None) -> bytes:
    """The app's ApiError answer for `reason` as a whole HTTP/1.1 response
    that closes the connection (no request exists yet to answer through the app)."""
    answer = ApiError.of(reason, message, retry_after_s=retry_after_s).response()
    head = f"HTTP/1.1 {answer.status_code} {HTTPStatus(answer.status_code).phrase}\r\n".encode("ascii")
    head += b"".join(name + b": " + value + b"\r\n" for name, value in answer.raw_headers)
    return head + b"connection: close\r\n\r\n" + answer.body


def edge_protocol(limits: EdgeLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with `limits` (pass as uvicorn's `http`)."""

    class EdgeProtocol(HttpToolsProtocol):
        _header_timer = None
        _write_timer = None
        _received_bytes = False  # since the connection went idle (the next request's head began)
        _request_open = False  # a request's message began and has not been wholly received
        _in_head = False  # ... and its headers are not complete
        _head_bytes = 0  # of the head being received: its complete lines (the parser's callbacks)
        _head_read_bytes = 0  # ... and the reads after the one it began in
        _head_too_large = False

        def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
            super().connection_made(transport)
            refusal = self._over_connection_limits()
            if refusal is not None:
                transport.write(refusal)
                transport.close()
                return
            self._arm_header_timer()

        def _idle(self) -> bool:
            """No request in progress: the last one was wholly received and
            answered (the next bytes begin a new head)."""
            return not self._request_open and (self.cycle is None or self.cycle.response_complete)

        def data_received(self, data: bytes) -> None:
            if data and self._idle():
                self._received_bytes = True
                if self._header_timer is None:
                    self._arm_header_timer()  # part of a next request on a kept-alive connection
            head_before = self._in_head
            super().data_received(data)
            # A head still incomplete after this read: the reads after the one
            # it began in count whole (a header line that never ends reaches
            # no callback, and the parser would buffer it without bound).
            if self._in_head and not self.transport.is_closing():
                if head_before:
                    self._head_read_bytes += len(data)
                if self._head_read_bytes > limits.max_header_bytes:
                    self._head_too_large = True
                    self.send_400_response("request head too large")

        # Parser callbacks: the head's size as it is parsed (a head and a
        # body can arrive in one read, so a read's size alone says nothing).
        def on_message_begin(self) -> None:
            self._request_open = True
            self._in_head = True
            self._head_bytes = self._head_read_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + HEADER_LINE_OVERHEAD_BYTES)
            super().on_header(name, value)

        def _count_head(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > limits.max_header_bytes:
                self._head_too_large = True
                raise _HeadTooLarge

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm_header_timer()  # the headers are in: the app's own timeouts apply
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._request_open = False
            super().on_message_complete()
            if self.cycle is not None and self.cycle.response_complete and not self.transport.is_closing():
                # Answered before its body was all in (a 401, a 413): the
                # body's reads cancelled the keep-alive timer the answer armed.
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def on_response_complete(self) -> None:
            self._received_bytes = False
            super().on_response_complete()  # arms the keep-alive timeout, or starts a pipelined request

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            self._disarm_write_timer()
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            # The socket's buffer is full: the client reads nothing. A write
            # that stays paused this long means it never will.
            super().pause_writing()
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(limits.write_timeout_s, self._write_timeout)

        def resume_writing(self) -> None:
            self._disarm_write_timer()
            super().resume_writing()

        def _disarm_write_timer(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_timeout(self) -> None:
            self._write_timer = None
            limits.closes["write_timeout"] += 1
            log.info("closing a connection from %s: nothing read for %g s", self.client and self.client[0],
                     limits.write_timeout_s)
            self.transport.abort()

        def send_400_response(self, msg: str) -> None:
            limits.closes["malformed"] += 1
            if self._head_too_large:
                message = f"The request line and headers are over {limits.max_header_bytes} bytes."
            else:
                message = f"Malformed HTTP request: {msg}"
            if not self.transport.is_closing():
                self.transport.write(error_response(Reason.INVALID_REQUEST, message))
                self.transport.close()

        def _over_connection_limits(self) -> bytes | None:
            if limits.max_connections and len(self.connections) > limits.max_connections:
                limits.closes["too_many_connections"] += 1
                log.warning("refusing a connection: %d open, the limit is %d", len(self.connections) - 1,
                            limits.max_connections)
                return error_response(Reason.TOO_MANY_CONNECTIONS, "This server has too many open connections; "
                                      "retry shortly.", limits.retry_after_s)
            if limits.max_connections_per_client and self.client is not None:
                host = self.client[0]
                mine = sum(1 for other in self.connections if other.client is not None and other.client[0] == host)
                if mine > limits.max_connections_per_client:
                    limits.closes["client_connections"] += 1
                    return error_response(Reason.CLIENT_CONNECTIONS, f"Too many open connections from this "
                                          f"address (limit {limits.max_connections_per_client}).",
                                          limits.retry_after_s)
            return None

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or not (self._in_head or self._idle()):
                return
            limits.closes["header_timeout"] += 1
            if self._received_bytes:
                self.transport.write(error_response(
                    Reason.REQUEST_TIMEOUT, f"The request headers did not arrive within {limits.header_timeout_s:g} s."))
            self.transport.close()

    return EdgeProtocol
