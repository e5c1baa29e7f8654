"""Pages parse in both formats the services may serve."""

from sluice.top.exposition import parse_page

OPENMETRICS = """# TYPE sluice_time_to_first_token_seconds histogram
sluice_time_to_first_token_seconds_bucket{class="interactive",model="llama",le="0.1"} 2 # {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 0.05
sluice_time_to_first_token_seconds_bucket{class="interactive",model="llama",le="+Inf"} 3
sluice_time_to_first_token_seconds_count{class="interactive",model="llama"} 3
sluice_time_to_first_token_seconds_sum{class="interactive",model="llama"} 0.4
# TYPE sluice_gateway_rejections counter
# EOF
"""


def test_openmetrics_with_exemplars_when_the_server_says_so():
    page = parse_page(OPENMETRICS, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    buckets = page.series("sluice_time_to_first_token_seconds_bucket", le="0.1")
    assert [(b.label("class"), b.value) for b in buckets] == [("interactive", 2.0)]
    # Declared, no samples yet: present (zero), not absent.
    assert page.has_family("sluice_gateway_rejections_total") and not page.series("sluice_gateway_rejections_total")
    assert not page.has_family("sluice_inter_token_latency_seconds_bucket")


def test_text_format_keeps_sample_names_as_exposed():
    page = parse_page("# TYPE sluice_engine_steps counter\nsluice_engine_steps_total{replica=\"r\"} 7\n")
    assert page.series("sluice_engine_steps_total")[0].value == 7
    assert page.has_family("sluice_engine_steps_total")
