from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from sluice.gateway.metrics import GatewayMetrics
from sluice.gateway.stream_timing import StreamTiming


def _value(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def _timing(metrics: GatewayMetrics, slo_s: float = 2.0, service_class: str = "interactive",
            version: str = "tiny-llama-v1") -> StreamTiming:
    metrics.versions.learn("tiny-llama-v1", "tiny-llama-v2")  # as the router's admitted events teach it
    return StreamTiming.start(metrics, "tiny-llama", service_class, version, arrived_s=100.0, ttft_slo_s=slo_s)


def test_first_chunk_is_ttft_and_the_gaps_are_inter_token_latency():
    metrics = GatewayMetrics.create()
    timing = _timing(metrics)
    for now_s in (100.5, 100.6, 100.8):
        timing.content(now_s)
    timing.finished(101.0, outcome="finished")
    labels = {"model": "tiny-llama", "class": "interactive", "version": "tiny-llama-v1"}
    assert _value(metrics, "sluice_time_to_first_token_seconds_sum", **labels) == 0.5
    assert _value(metrics, "sluice_inter_token_latency_seconds_count", **labels) == 2
    assert abs(_value(metrics, "sluice_inter_token_latency_seconds_sum", **labels) - 0.3) < 1e-9
    assert _value(metrics, "sluice_e2e_request_latency_seconds_sum", **labels) == 1.0
    assert _value(metrics, "sluice_slo_requests_total", result="met", **labels) == 1


def test_a_ttft_past_the_class_slo_is_missed_and_an_unfinished_stream_not_counted():
    metrics = GatewayMetrics.create()
    late = _timing(metrics, slo_s=2.0)
    late.content(103.0)
    late.finished(104.0, outcome="finished")
    cancelled = _timing(metrics, slo_s=2.0)
    cancelled.content(100.1)
    cancelled.finished(100.2, outcome="cancelled")
    batch = _timing(metrics, slo_s=600.0, service_class="batch")
    batch.content(103.0)
    batch.finished(104.0, outcome="finished")
    v1 = {"model": "tiny-llama", "version": "tiny-llama-v1"}
    assert _value(metrics, "sluice_slo_requests_total", **v1, **{"class": "interactive"}, result="missed") == 1
    assert _value(metrics, "sluice_slo_requests_total", **v1, **{"class": "interactive"}, result="met") == 0
    assert _value(metrics, "sluice_slo_requests_total", **v1, **{"class": "batch"}, result="met") == 1


def test_each_version_has_its_own_latencies_and_outcomes():
    metrics = GatewayMetrics.create()
    for version, outcome, ttft_s in (("tiny-llama-v1", "finished", 0.2), ("tiny-llama-v2", "finished", 0.7),
                                     ("tiny-llama-v2", "error", 0.1), ("tiny-llama-v2", "cancelled", 0.1)):
        timing = _timing(metrics, version=version)
        timing.content(100.0 + ttft_s)
        timing.finished(101.0, outcome=outcome)

    def of(name: str, version: str, **labels: str) -> float:
        return _value(metrics, name, model="tiny-llama", version=version, **{"class": "interactive"}, **labels)

    assert abs(of("sluice_time_to_first_token_seconds_sum", "tiny-llama-v1") - 0.2) < 1e-9
    assert abs(of("sluice_time_to_first_token_seconds_sum", "tiny-llama-v2") - 0.9) < 1e-9
    assert of("sluice_version_responses_total", "tiny-llama-v2", outcome="finished") == 1
    assert of("sluice_version_responses_total", "tiny-llama-v2", outcome="error") == 1
    assert of("sluice_version_responses_total", "tiny-llama-v2", outcome="cancelled") == 1
    assert of("sluice_version_responses_total", "tiny-llama-v1", outcome="error") == 0
    # Goodput counts finished responses only.
    assert of("sluice_slo_requests_total", "tiny-llama-v2", result="met") == 1


def test_a_version_the_router_never_named_is_unknown():
    metrics = GatewayMetrics.create()
    timing = _timing(metrics, version="made-up")
    timing.finished(100.5, outcome="error")
    assert _value(metrics, "sluice_version_responses_total", model="tiny-llama", version="unknown",
                  outcome="error", **{"class": "interactive"}) == 1


def test_exemplars_name_the_trace_only_when_it_is_recorded():
    untraced = GatewayMetrics.create()
    timing = _timing(untraced)
    timing.content(100.5)
    timing.content(100.6)
    assert b"trace_id" not in openmetrics_latest(untraced.registry)

    traced = GatewayMetrics.create()
    with TracerProvider().get_tracer("test").start_as_current_span("request") as span:
        timing = _timing(traced)
    timing.content(100.5)  # later, outside the span's context: the exemplar was taken at the start
    timing.content(100.6)
    trace_id = format(span.get_span_context().trace_id, "032x")
    page = openmetrics_latest(traced.registry).decode()
    exemplar_lines = [line for line in page.splitlines() if f'trace_id="{trace_id}"' in line]
    assert any(line.startswith("sluice_time_to_first_token_seconds_bucket") for line in exemplar_lines)
    assert any(line.startswith("sluice_inter_token_latency_seconds_bucket") for line in exemplar_lines)


def test_rejections_name_the_tenant_top_n_then_other():
    metrics = GatewayMetrics.create(max_tenant_labels=1)
    metrics.rejected("rate_limit_exceeded", "acme")
    metrics.rejected("rate_limit_exceeded", "globex")
    metrics.rejected("invalid_api_key", None)
    assert _value(metrics, "sluice_gateway_rejections_total", reason="rate_limit_exceeded", tenant="acme") == 1
    assert _value(metrics, "sluice_gateway_rejections_total", reason="rate_limit_exceeded", tenant="other") == 1
    assert _value(metrics, "sluice_gateway_rejections_total", reason="invalid_api_key", tenant="unknown") == 1


def test_outbox_depth_is_read_on_scrape():
    depth = [3]
    metrics = GatewayMetrics.create(outbox_depth=lambda: depth[0])
    assert _value(metrics, "sluice_ledger_outbox_depth") == 3
    depth[0] = 0
    assert _value(metrics, "sluice_ledger_outbox_depth") == 0
