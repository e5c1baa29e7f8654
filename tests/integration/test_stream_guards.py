"""A stream cannot hold memory or a replica forever: a client that stops
reading is cut off once its stream's unread events pass the bound (the
replica's KV comes back at once, the client reads `slow_reader` if it ever
reads again), and a replica that stops making progress (here: its process
stopped with SIGSTOP, its gRPC call still open) ends the stream in-band
with `replica_lost` after the router's stall timeout.

A stack of its own, with a small bound and a short stall timeout, since a
stopped replica would disturb the shared one."""

import json
import os
import signal
import socket
import time

import h11
import httpx
import pytest

from integration.conftest import eventually, metric, scrape
from sluice.devstack.stack import LocalStack, StackPorts

pytestmark = pytest.mark.stack

BUFFER_EVENTS = 8
STALL_TIMEOUT_S = 1.5
LONG_OUTPUT_TOKENS = 3000  # minutes of CPU decoding if nothing cut it short
# The client's socket: a small receive buffer and Linux's smallest segment
# (TCP_MIN_MSS), so the gateway's send buffer stays small too (its size
# follows the segment size; at loopback's 64 KiB segments it is megabytes,
# more than all of LONG_OUTPUT_TOKENS). A client that stops reading then
# holds the gateway's writes back after a few hundred events.
CLIENT_RECEIVE_BUFFER_BYTES = 1024
CLIENT_MAX_SEGMENT_BYTES = 88


@pytest.fixture(scope="module")
def guarded(tiny_model_dir, tmp_path_factory):
    stack = LocalStack(
        model_dir=tiny_model_dir,
        log_dir=tmp_path_factory.mktemp("guarded-logs"),
        ports=StackPorts.ephemeral(),
        cwd=tmp_path_factory.mktemp("guarded-cwd"),
        extra_env={
            "SLUICE_STREAM_BUFFER_EVENTS": str(BUFFER_EVENTS),
            "SLUICE_STREAM_STALL_TIMEOUT_S": str(STALL_TIMEOUT_S),
            "SLUICE_CANARY_INTERVAL_S": "1",
        },
    )
    with stack.running(timeout_s=180):
        yield stack


def _body() -> dict:
    return {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": LONG_OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }


def _read_events(lines, count: int) -> list[str]:
    """Lines up to and including the `count`th data line of an httpx stream."""
    seen: list[str] = []
    while sum(line.startswith("data: ") for line in seen) < count:
        seen.append(next(lines))
    return seen


def _payloads(lines: list[str]) -> list:
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [item if item == "[DONE]" else json.loads(item) for item in data]


def _released(stack) -> bool:
    """Nothing runs on the replica, every KV block is free, and the router
    and scheduler hold nothing for the stream."""
    replica = scrape(stack.metrics_url("replica"))
    return (
        metric(replica, "sluice_num_requests_running") == 0
        and metric(replica, "sluice_kv_blocks", state="used") == 0
        and metric(scrape(stack.metrics_url("router")), "sluice_router_streams_active") == 0
        and metric(scrape(stack.metrics_url("scheduler")), "sluice_scheduler_reservations") == 0
    )


class StalledClient:
    """An HTTP client on a raw socket, so the socket options are set before
    it connects (httpx sets them after, when the segment size is agreed)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER_BYTES)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, CLIENT_MAX_SEGMENT_BYTES)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.http = h11.Connection(our_role=h11.CLIENT)
        self.status: int | None = None
        self.body = b""

    def post(self, path: str, body: dict, headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        request = h11.Request(method="POST", target=path, headers=[
            ("Host", "gateway"), ("Content-Type", "application/json"), ("Content-Length", str(len(data))),
            ("Connection", "close"), *headers.items()])
        self.sock.sendall(self.http.send(request) + self.http.send(h11.Data(data=data))
                          + self.http.send(h11.EndOfMessage()))

    def read_until(self, done) -> None:
        """Receive until `done(self)` or the end of the response."""
        while not done(self):
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                self.http.receive_data(self.sock.recv(4096))
            elif isinstance(event, h11.Response):
                self.status = event.status_code
            elif isinstance(event, h11.Data):
                self.body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return

    def data_lines(self) -> list[str]:
        return [line for line in self.body.decode().split("\n") if line.startswith("data: ")]


def test_a_client_that_stops_reading_is_cut_off_and_the_replica_freed(guarded):
    before = scrape(guarded.metrics_url("replica"))
    client = StalledClient(guarded.ports.gateway)
    try:
        client.post("/v1/chat/completions", _body(), {"Authorization": f"Bearer {guarded.api_key}"})
        client.read_until(lambda c: len(c.data_lines()) >= 2)  # the role chunk and a first token
        assert client.status == 200
        # Stop reading. The gateway's writes back up behind the socket, its
        # queue for the stream passes the bound, and the request is
        # cancelled at the router and the replica.
        eventually(lambda: _released(guarded), timeout_s=30)
        generated = metric(scrape(guarded.metrics_url("replica")), "sluice_replica_generation_tokens_total")
        assert generated - metric(before, "sluice_replica_generation_tokens_total") < LONG_OUTPUT_TOKENS / 2
        # Reading again: what was in the socket, then the reason and the end.
        client.read_until(lambda c: False)
    finally:
        client.sock.close()
    payloads = _payloads(client.data_lines())
    assert payloads[-1] == "[DONE]"
    error = payloads[-2]["error"]
    assert (error["code"], error["type"]) == ("slow_reader", "invalid_request_error")
    assert "not read fast enough" in error["message"]
    eventually(lambda: metric(scrape(guarded.gateway_url + "/metrics"), "sluice_gateway_streams_active") == 0)


def test_a_stopped_replica_ends_the_stream_with_replica_lost_after_the_stall_timeout(guarded):
    replica = guarded.processes["replica"]
    headers = {"Authorization": f"Bearer {guarded.api_key}"}
    stopped_at = None
    try:
        with httpx.Client(timeout=STALL_TIMEOUT_S + 20) as client:
            with client.stream("POST", guarded.gateway_url + "/v1/chat/completions", json=_body(),
                               headers=headers) as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                seen = _read_events(lines, 3)
                os.kill(replica.pid, signal.SIGSTOP)  # alive, its call open, no step finishes
                stopped_at = time.monotonic()
                seen += list(lines)  # the read timeout bounds this if nothing ends it
                ended_after_s = time.monotonic() - stopped_at
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    payloads = _payloads(seen)
    assert payloads[-1] == "[DONE]"
    error = payloads[-2]["error"]
    assert (error["code"], error["type"]) == ("replica_lost", "service_unavailable_error")
    assert "stopped making progress" in error["message"]
    # By the stall timeout (plus slack for a loaded box), not the read timeout.
    assert ended_after_s < STALL_TIMEOUT_S + 15
    # Running again, the replica hears the cancel the router sent and frees the KV.
    eventually(lambda: _released(guarded), timeout_s=30)
