"""Hostile input at the real gateway process: every request-shaped input
ends in a 2xx or a 4xx in OpenAI's error shape, and no connection is held
for ever. The shared stack runs with short HTTP timeouts (conftest)."""

import json
import socket
import time

import httpx
import pytest

from integration.conftest import HTTP_BODY_TIMEOUT_S, HTTP_HEADER_TIMEOUT_S

pytestmark = pytest.mark.stack


def _post(stack, body: bytes | dict, path: str = "/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(stack.gateway_url + path, content=content, timeout=30.0, headers={
        "Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"})


def _chat(**overrides) -> dict:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **overrides}


def _raw(body: dict) -> bytes:
    """JSON as a client may send it: json.dumps escapes a lone surrogate as \\ud800."""
    return json.dumps(body).encode()


def _assert_openai_error(response: httpx.Response, status: int, code: str | None = None,
                         param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(("body", "param"), [
    (_chat(messages=[{"role": "user", "content": "a\ud800b"}]), "messages.0.content"),
    (_chat(messages=[{"role": "user", "content": "hi", "name": "\udfff"}]), "messages.0.name"),
    (_chat(stop=["ok", "\ud83d"]), "stop.1"),
    (_chat(model="tiny\ud800"), "model"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(stack, body, param):
    error = _assert_openai_error(_post(stack, _raw(body)), 400, "invalid_request", param)
    assert "surrogate" in error["message"]


def test_a_surrogate_pair_is_text_and_served(stack):
    response = _post(stack, _raw(_chat(messages=[{"role": "user", "content": "smile \U0001F600"}])))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("where", ["top", "messages", "metadata"])
def test_deep_nesting_anywhere_is_a_400(stack, where):
    deep = "[" * 5000 + "]" * 5000
    body = {"top": deep, "messages": '[{"role": "user", "content": ' + deep + "}]",
            "metadata": '{"m": ' + deep + "}"}[where]
    if where == "top":
        raw = deep.encode()
    else:
        raw = ('{"model": "tiny-llama", "max_tokens": 2, ' + (
            f'"messages": {body}' if where == "messages" else
            f'"messages": [{{"role": "user", "content": "hi"}}], "metadata": {body}') + "}").encode()
    _assert_openai_error(_post(stack, raw), 400, "invalid_json")


def test_json_constants_that_are_not_numbers_are_a_400(stack):
    raw = b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    _assert_openai_error(_post(stack, raw), 400, "invalid_json")


def test_cross_field_and_range_rules(stack):
    _assert_openai_error(_post(stack, _chat(max_tokens=2, min_tokens=3)), 400, "invalid_request", "min_tokens")
    _assert_openai_error(_post(stack, _chat(stop=["x" * 2000])), 400, "invalid_request", "stop")
    _assert_openai_error(_post(stack, _chat(stop=["a", "b", "c", "d", "e"])), 400, "invalid_request", "stop")
    _assert_openai_error(_post(stack, _chat(seed=2**70)), 400, "invalid_request", "seed")
    assert _post(stack, _chat(max_tokens=2, min_tokens=2)).status_code == 200


@pytest.mark.parametrize("query", [
    "start=0001-01-01", "end=0001-01-01T00:00:00", "end=9999-12-31", "start=1e30", "end=99999999999999999999",
    "start=0001-01-01T00:00:00%2B14:00", "start=not-a-date",
])
def test_usage_dates_at_the_calendars_edges_are_a_400(stack, query):
    response = httpx.get(f"{stack.gateway_url}/v1/usage?{query}", timeout=10.0,
                         headers={"Authorization": f"Bearer {stack.api_key}"})
    _assert_openai_error(response, 400, "invalid_request")


@pytest.mark.parametrize("service", ["gateway", "router"])
def test_unknown_model_names_never_become_metric_labels(stack, service):
    metrics_url = stack.gateway_url + "/metrics" if service == "gateway" else stack.metrics_url("router")
    before = httpx.get(metrics_url, timeout=5.0).text
    names = [f"model-{service}-{i}-" + "x" * 500 + "\x01\x1b[31m" for i in range(20)]
    for name in names:
        assert _post(stack, _chat(model=name)).status_code == 404
    after = httpx.get(metrics_url, timeout=5.0).text
    assert f"model-{service}-" not in after
    assert "\x1b" not in after and "\x01" not in after
    assert len(after) < len(before) + 2_000  # the "unknown" series, not twenty new ones


def test_wrong_method_and_unknown_path_answer_in_openai_shape(stack):
    response = httpx.get(stack.gateway_url + "/v1/chat/completions", timeout=5.0)
    error = _assert_openai_error(response, 405, "method_not_allowed")
    assert error["type"] == "invalid_request_error"
    assert "POST" in response.headers["allow"]
    error = _assert_openai_error(httpx.get(stack.gateway_url + "/v1/nothing-here", timeout=5.0), 404, "not_found")
    assert error["type"] == "invalid_request_error"


def _connect(stack) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", stack.ports.gateway), timeout=10.0)
    return sock


def _read_all(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything until the server closes; and how long that took."""
    sock.settimeout(timeout_s)
    started = time.monotonic()
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic() - started
        data += chunk


def _json_body(response: bytes) -> dict:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"application/json" in head.lower()
    return json.loads(body)


def test_malformed_http_is_a_400_in_openai_shape(stack):
    with _connect(stack) as sock:
        sock.sendall(b"GARBAGE / HTTP/9.9\r\n\x00\x01\r\n\r\n")
        response, _ = _read_all(sock, 5.0)
    assert response.startswith(b"HTTP/1.1 400")
    assert _json_body(response)["error"]["type"] == "invalid_request_error"


def test_a_partial_request_line_is_answered_408_and_closed_within_the_header_timeout(stack):
    with _connect(stack) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        response, waited_s = _read_all(sock, HTTP_HEADER_TIMEOUT_S + 10.0)
    assert response.startswith(b"HTTP/1.1 408")
    assert _json_body(response)["error"]["code"] == "request_timeout"
    assert waited_s < HTTP_HEADER_TIMEOUT_S + 5.0


def test_a_body_shorter_than_its_content_length_is_answered_408(stack):
    with _connect(stack) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + stack.api_key.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"mo")
        response, waited_s = _read_all(sock, HTTP_BODY_TIMEOUT_S + 10.0)
    assert response.startswith(b"HTTP/1.1 408")
    assert b"request_timeout" in response
    assert waited_s < HTTP_BODY_TIMEOUT_S + 5.0


def test_a_connection_that_sends_nothing_is_closed_and_counted(stack):
    def closes() -> float:
        page = httpx.get(stack.gateway_url + "/metrics", timeout=5.0).text
        return next(float(line.split()[-1]) for line in page.splitlines()
                    if line.startswith('sluice_gateway_http_edge_closes_total{reason="header_timeout"}'))

    before = closes()
    with _connect(stack) as sock:
        response, waited_s = _read_all(sock, HTTP_HEADER_TIMEOUT_S + 10.0)
    assert response == b""
    assert waited_s < HTTP_HEADER_TIMEOUT_S + 5.0
    assert closes() == before + 1


def test_a_client_that_leaves_mid_stream_is_not_logged_as_an_error(stack):
    before = stack.log("gateway")
    with httpx.Client(timeout=30.0) as client:
        with client.stream("POST", stack.gateway_url + "/v1/chat/completions",
                           json=_chat(max_tokens=200, stream=True, ignore_eos=True),
                           headers={"Authorization": f"Bearer {stack.api_key}"}) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    break  # and leave
    time.sleep(1.0)
    added = stack.log("gateway")[len(before):]
    assert "Traceback" not in added and "ERROR" not in added, added


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_before_the_first_token_is_not_logged_as_an_error(stack, stream):
    before = stack.log("gateway")
    body = json.dumps(_chat(max_tokens=300, stream=stream, ignore_eos=True)).encode()
    with _connect(stack) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + stack.api_key.encode() + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.05)  # admitted and generating; then the client is gone
    time.sleep(1.5)
    added = stack.log("gateway")[len(before):]
    assert "Traceback" not in added and "ERROR" not in added, added
