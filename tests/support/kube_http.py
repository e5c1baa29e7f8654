"""The HTTP side of the fake Kubernetes API (tests/support/fake_kube_api.py):
errors as the API's Status objects, JSON bodies, and watch streams written
as chunked newline-delimited events, the way the `kubernetes` client's
urllib3 reads them one line at a time."""

import json
import select
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from support.kube_selectors import SelectorError

Obj = dict[str, Any]
_TRUE = {"true", "1"}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def handler_for(api: Any) -> type[BaseHTTPRequestHandler]:
    """The request handler class for `api` (a FakeKubeApi: `handle` and `open_watch`)."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the client's urllib3 pool expects

        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, code: int, obj: Obj) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = dict(parse_qsl(parts.query))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            try:
                body = json.loads(raw) if raw else None
                if method == "GET" and query.get("watch", "").lower() in _TRUE:
                    self._stream(api.open_watch(parts.path, query, self._client_gone))
                else:
                    self._reply(200 if method != "POST" else 201,
                                api.handle(method, parts.path, query, content_type, body))
            except ApiError as error:
                self._reply(error.code, error.status())
            except (json.JSONDecodeError, SelectorError) as error:
                self._reply(400, ApiError(400, "BadRequest", str(error)).status())

        def _client_gone(self) -> bool:
            """The client closed its end (readable with nothing to read); it sends nothing during a watch."""
            readable, _, _ = select.select([self.connection], [], [], 0)
            try:
                return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:
                return True

        def _stream(self, events: Iterator[Obj]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in events:
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()  # runs the generator's finally now, so open_watches is exact

        def do_GET(self) -> None:  # noqa: N802 - the http.server hook names
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

        def do_PATCH(self) -> None:  # noqa: N802
            self._serve("PATCH")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

    return Handler
