"""A real HTTP server on loopback serving fixed /metrics pages."""

import http.server
import threading
from collections.abc import Iterator

import pytest

from top_pages import replica_text

PAGES = {
    "/metrics": (200, replica_text(True)),
    "/broken": (500, "oops"),
    "/garbage": (200, "this is { not a metrics page\n"),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body = PAGES.get(self.path, (404, "no"))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


