"""The Prometheus reader against a loopback HTTP server answering
/api/v1/query in Prometheus's response shapes (the live rollout test runs
the same queries on a real Prometheus)."""

import pytest
from rollout_support import FakePrometheus, vector

from sluice.rollout.prometheus import PrometheusError, PrometheusReader, version_queries


@pytest.fixture()
def prometheus():
    with FakePrometheus() as fake:
        yield fake


def test_a_sample_reads_each_versions_quantiles_error_rate_and_requests(prometheus):
    candidate = version_queries("tiny-llama-v2", 60, "interactive")
    serving = version_queries("tiny-llama-v1", 60, "interactive")
    prometheus.answers.update({
        candidate.requests: (200, vector("42")), candidate.ttft_p99: (200, vector("0.8")),
        candidate.itl_p99: (200, vector("0.05")), candidate.error_rate: (200, vector("0.02")),
        serving.requests: (200, vector("0")), serving.ttft_p99: (200, vector("NaN")),
        serving.itl_p99: (200, vector()), serving.error_rate: (200, vector()),
    })
    reader = PrometheusReader(prometheus.url, min_window_s=30)
    sample = reader.sample("tiny-llama-v1", "tiny-llama-v2", window_s=59.2)
    assert (sample.candidate.requests, sample.candidate.ttft_p99_s, sample.candidate.itl_p99_s,
            sample.candidate.error_rate) == (42.0, 0.8, 0.05, 0.02)
    # No traffic: NaN and empty vectors are "no data", never zero latency.
    assert (sample.serving.requests, sample.serving.ttft_p99_s, sample.serving.itl_p99_s,
            sample.serving.error_rate) == (0.0, None, None, None)
    assert len(prometheus.queries) == 8


def test_the_queries_select_one_version_and_class_over_the_window():
    queries = version_queries('odd"name', 12.3, "interactive")
    assert queries.ttft_p99 == ('histogram_quantile(0.99, sum by (le) (rate(sluice_time_to_first_token_seconds_bucket'
                                '{version="odd\\"name", class="interactive"}[13s])))')
    assert "sluice_inter_token_latency_seconds_bucket" in queries.itl_p99
    assert 'outcome="error"' in queries.error_rate and "or vector(0)" in queries.error_rate
    assert queries.requests == ('sum(increase(sluice_version_responses_total{version="odd\\"name", '
                                'class="interactive", outcome=~"finished|error"}[13s]))')
    assert "class=" not in version_queries("v", 60, None).ttft_p99


def test_short_windows_are_floored_for_rate(prometheus):
    reader = PrometheusReader(prometheus.url, min_window_s=30)
    reader.sample("a", "b", window_s=2)
    assert all("[30s]" in q for q in prometheus.queries)


def test_errors_say_what_prometheus_answered(prometheus):
    queries = version_queries("v2", 30, "interactive")
    prometheus.answers[queries.requests] = (400, {"status": "error", "errorType": "bad_data",
                                                  "error": "parse error"})
    reader = PrometheusReader(prometheus.url, min_window_s=30)
    with pytest.raises(PrometheusError, match="HTTP 400 bad_data parse error"):
        reader.version_sample("v2", 30)
    prometheus.answers[queries.requests] = (200, vector("1", "2"))
    with pytest.raises(PrometheusError, match="2 series"):
        reader.version_sample("v2", 30)
    with pytest.raises(PrometheusError, match="cannot reach Prometheus"):
        PrometheusReader("http://127.0.0.1:9", timeout_s=1).scalar("up")
    with pytest.raises(ValueError, match="http://"):
        PrometheusReader("prometheus:9090")
