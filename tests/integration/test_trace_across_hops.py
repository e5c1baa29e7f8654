"""One streamed chat completion through the four real processes, traced:
every hop exports to a loopback OTLP receiver, and the spans form one trace
with the right parentage and timing; the gateway's TTFT and ITL carry the
trace id as an exemplar."""

import uuid
from pathlib import Path

import httpx
import openai
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from integration.conftest import eventually
from integration.otlp_receiver import OtlpReceiver, ReceivedSpan, tracing_env
from sluice.devstack.stack import LocalStack, StackPorts

pytestmark = pytest.mark.stack

OUTPUT_TOKENS = 8


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver().running() as running:
        yield running


@pytest.fixture(scope="module")
def traced_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver):
    log_dir = tmp_path_factory.mktemp("traced-stack")
    local = LocalStack(
        model_dir=tiny_model_dir, log_dir=log_dir, ports=StackPorts.ephemeral(),
        extra_env={
            **tracing_env(receiver.endpoint),
            "SLUICE_CANARY_INTERVAL_S": "1",
            "SLUICE_LOG_FORMAT": "json",
            "SLUICE_DATABASE_URL": f"sqlite:///{log_dir / 'ledger.db'}",
            "SLUICE_OUTBOX_PATH": str(log_dir / "outbox.db"),
            "SLUICE_REDIS_KEY_PREFIX": f"sluice-trace-{uuid.uuid4().hex[:8]}",
        },
    )
    with local.running(timeout_s=180):
        yield local


@pytest.fixture(scope="module")
def traced_request(traced_stack: LocalStack, receiver: OtlpReceiver) -> list[ReceivedSpan]:
    """The spans of one streamed chat completion, once all hops exported them."""
    client = openai.OpenAI(base_url=traced_stack.gateway_url + "/v1", api_key=traced_stack.api_key, max_retries=0)
    stream = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Trace me through every hop."}],
        max_tokens=OUTPUT_TOKENS, temperature=0, stream=True, extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def trace_of_decode() -> list[ReceivedSpan]:
        spans = receiver.spans()
        decodes = [s for s in spans if s.name == "replica.decode"]
        if not decodes:
            return []
        return [s for s in spans if s.trace_id == decodes[0].trace_id]

    def closed(trace: list[ReceivedSpan]) -> bool:
        # Each process exports in its own batches, and the router's span ends
        # after the replica's: the trace is whole once the gateway's server
        # span is in and no span points at a parent still in flight.
        ids = {s.span_id for s in trace}
        return (any(_is_gateway_server_span(s) for s in trace)
                and all(s.parent_id in ids for s in trace if s.parent_id and s.parent_id != "0" * 16))

    try:
        eventually(lambda: closed(trace_of_decode()), timeout_s=30)
    except AssertionError:
        pass  # the tests below name what is missing
    return trace_of_decode()


def _is_gateway_server_span(span: ReceivedSpan) -> bool:
    return span.service == "sluice-gateway" and span.span.kind == Span.SPAN_KIND_SERVER


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    named = [s for s in spans if s.name == name]
    assert len(named) == 1, f"{len(named)} spans named {name}: {sorted(s.name for s in spans)}"
    return named[0]


def test_one_trace_spans_every_service(traced_request):
    services = {s.service for s in traced_request}
    assert services == {"sluice-gateway", "sluice-router", "sluice-scheduler", "sluice-replica"}
    names = {s.name for s in traced_request}
    for expected in ("gateway.auth", "gateway.limits", "gateway.ledger_write", "router.generate",
                     "router.tokenize", "router.admission", "scheduler.queue", "scheduler.placement",
                     "replica.prefill", "replica.decode"):
        assert expected in names, f"{expected} missing from {sorted(names)}"


def test_the_replica_spans_descend_from_the_gateway_server_span(traced_request):
    by_id = {s.span_id: s for s in traced_request}
    for name in ("replica.prefill", "replica.decode", "scheduler.placement"):
        chain = [_one(traced_request, name)]
        while chain[-1].parent_id and chain[-1].parent_id != "0" * 16:
            assert chain[-1].parent_id in by_id, f"{chain[-1].name}'s parent was not exported"
            chain.append(by_id[chain[-1].parent_id])
        assert _is_gateway_server_span(chain[-1]), [s.name for s in chain]
        assert "router.generate" in [s.name for s in chain]
    queue = _one(traced_request, "scheduler.queue")
    assert by_id[queue.parent_id].name == "router.admission"


def test_queue_prefill_and_decode_are_ordered_and_decode_is_one_span(traced_request):
    queue = _one(traced_request, "scheduler.queue").span
    prefill = _one(traced_request, "replica.prefill").span
    decode = _one(traced_request, "replica.decode")  # one span for all the tokens
    server = next(s.span for s in traced_request if _is_gateway_server_span(s))
    assert server.start_time_unix_nano <= queue.start_time_unix_nano <= queue.end_time_unix_nano
    assert queue.end_time_unix_nano <= prefill.start_time_unix_nano <= prefill.end_time_unix_nano
    assert prefill.end_time_unix_nano <= decode.span.start_time_unix_nano <= decode.span.end_time_unix_nano
    assert decode.span.end_time_unix_nano <= server.end_time_unix_nano
    assert decode.attribute("sluice.output_tokens") == OUTPUT_TOKENS
    assert [event.name for event in decode.span.events] == ["finished"]


def test_no_span_carries_prompt_or_output_text(traced_request):
    for span in traced_request:
        for attribute in span.span.attributes:
            assert "Trace me" not in str(attribute.value), (span.name, attribute.key)


def test_openmetrics_scrape_shows_the_trace_as_exemplar(traced_stack, traced_request):
    trace_id = traced_request[0].trace_id
    page = httpx.get(traced_stack.gateway_url + "/metrics",
                     headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5.0)
    assert page.headers["content-type"].startswith("application/openmetrics-text")
    for name in ("sluice_time_to_first_token_seconds_bucket", "sluice_inter_token_latency_seconds_bucket"):
        exemplars = [line for line in page.text.splitlines() if line.startswith(name) and " # {" in line]
        assert any(f'trace_id="{trace_id}"' in line for line in exemplars), (name, exemplars)
    plain = httpx.get(traced_stack.gateway_url + "/metrics", timeout=5.0)
    assert plain.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in plain.text


def test_a_refusal_is_counted_by_reason_and_tenant(traced_stack):
    def rejections() -> float:
        page = httpx.get(traced_stack.gateway_url + "/metrics", timeout=5.0).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                   if line.startswith('sluice_gateway_rejections_total{reason="invalid_api_key",tenant="unknown"}'))

    before = rejections()
    bad = openai.OpenAI(base_url=traced_stack.gateway_url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert rejections() == before + 1
