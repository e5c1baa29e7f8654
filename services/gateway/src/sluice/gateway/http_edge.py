"""Limits at the HTTP server, below the ASGI app: what uvicorn does not do.

uvicorn (0.54, h11) has a keep-alive timeout and a header size bound, but
no timeout for a request that never finishes its headers (a slowloris
connection costs its sender nothing and is held for ever), no bound on
connections per client address, and it answers malformed HTTP and its own
concurrency limit in plain text. `edge_protocol(limits)` is uvicorn's h11
protocol with those added:

    connection accepted ── over max_connections ───────────▶ 503 JSON, closed
                       └── over max_connections_per_client ▶ 429 JSON, closed
    request headers not complete within header_timeout_s ──▶ 408 JSON, closed
    (bytes received; an idle connection is just closed)
    a response the client stops reading, for write_timeout_s ▶ connection aborted
    (the app sees a disconnect: its stream is cancelled upstream, its slot freed)
    malformed request line or headers, or over the header bound ▶ 400 JSON

Answers are the app's own ApiError answers (OpenAI's error shape,
Retry-After where a retry helps), written as raw HTTP/1.1 since h11 has no
request to answer yet. The body read timeout is the app's
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

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from sluice.gateway.errors import ApiError
from sluice.outcomes import Reason

log = logging.getLogger(__name__)

# What the edge counts (sluice_gateway_http_edge_closes_total{reason}).
EDGE_REASONS = ("too_many_connections", "client_connections", "header_timeout", "write_timeout", "malformed")


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    header_timeout_s: float
    max_connections: int  # per process; 0 = no limit
    max_connections_per_client: int  # per client address; 0 = no limit
    retry_after_s: int = 1  # on a 429 or 503 for too many connections
    write_timeout_s: float = 60.0  # a paused write (the client reads nothing) for this long aborts
    # Connections refused or closed by these limits, by EDGE_REASONS; the
    # protocol (on the event loop) writes it, the metrics page reads it.
    closes: Counter = field(default_factory=Counter)


def error_response(reason: Reason, message: str, retry_after_s: int | None = None) -> bytes:
    """The app's ApiError answer for `reason` as a whole HTTP/1.1 response
    that closes the connection (h11 has no request to answer yet)."""
    answer = ApiError.of(reason, message, retry_after_s=retry_after_s).response()
    head = f"HTTP/1.1 {answer.status_code} {HTTPStatus(answer.status_code).phrase}\r\n".encode("ascii")
    head += b"".join(name + b": " + value + b"\r\n" for name, value in answer.raw_headers)
    return head + b"connection: close\r\n\r\n" + answer.body


def edge_protocol(limits: EdgeLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with `limits` (pass as uvicorn's `http`)."""

    class EdgeProtocol(H11Protocol):
        _header_timer = None
        _write_timer = None
        _received_bytes = False

        def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
            super().connection_made(transport)
            refusal = self._over_connection_limits()
            if refusal is not None:
                transport.write(refusal)
                transport.close()
                return
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            self._received_bytes = self._received_bytes or bool(data)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm_header_timer()  # the headers are in: the app's own timeouts apply
            elif self._header_timer is None:
                self._arm_header_timer()  # part of a next request on a kept-alive connection

        def on_response_complete(self) -> None:
            self._received_bytes = False
            super().on_response_complete()  # arms the keep-alive timeout for an idle connection

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
            if not self.transport.is_closing():
                self.transport.write(error_response(Reason.INVALID_REQUEST, f"Malformed HTTP request: {msg}"))
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
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            limits.closes["header_timeout"] += 1
            if self._received_bytes:
                self.transport.write(error_response(
                    Reason.REQUEST_TIMEOUT, f"The request headers did not arrive within {limits.header_timeout_s:g} s."))
            self.transport.close()

    return EdgeProtocol
