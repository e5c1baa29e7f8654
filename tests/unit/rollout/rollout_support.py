"""Shared by the rollout tests: a loopback HTTP server answering
/api/v1/query in Prometheus's response shapes."""

import http.server
import json
import threading
import urllib.parse
from collections.abc import Callable


def vector(*values: str) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [1700000000.0, value]} for value in values]}}


class FakePrometheus:
    """`answers[query]` if set, else `default(query)`; every query asked is in `queries`."""

    def __init__(self, default: Callable[[str], tuple[int, dict]] = lambda query: (200, vector())) -> None:
        self.answers: dict[str, tuple[int, dict]] = {}
        self.default = default
        self.queries: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                parsed = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(parsed.query).get("query", [""])[0]
                owner.queries.append(query)
                status, body = owner.answers.get(query) or owner.default(query)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakePrometheus":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
