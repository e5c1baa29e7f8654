"""The pure view model from two hand-written scrapes 2 s apart."""

import pytest

from sluice.top.exposition import parse_page
from sluice.top.model import OTHER_TENANT
from sluice.top.scrape import TargetScrape
from sluice.top.view import build_view

from top_pages import (
    GATEWAY, INTERVAL_S, ITL_P50_S, ITL_P99_S, REPLICA_0, REPLICA_1, SCHEDULER, TTFT_P50_S, TTFT_P99_S, fleet,
    replica_text,
)


def make_view(top_tenants: int = 3, **gateway_options: bool):
    return build_view(fleet(False, **gateway_options), fleet(True, **gateway_options), INTERVAL_S, top_tenants)


def row(rows, **fields):
    found = [r for r in rows if all(getattr(r, k) == v for k, v in fields.items())]
    assert len(found) == 1, (fields, rows)
    return found[0]


def test_queue_length_and_oldest_age_by_class():
    view = make_view()
    batch = row(view.classes, model="llama-v1", service_class="batch")
    assert (batch.queue_length, batch.queue_oldest_age_s) == (10, 42.5)
    interactive = row(view.classes, model="llama-v1", service_class="interactive")
    assert (interactive.queue_length, interactive.queue_oldest_age_s) == (3, 0.75)


def test_ttft_and_itl_percentiles_come_from_the_buckets_of_the_interval():
    # Before the interval 100 first tokens sat in le=5; quantiles of the
    # current counts alone would answer about 5 s.
    latency = row(make_view().classes, model="llama", service_class="interactive")
    assert latency.ttft_p50_s == pytest.approx(TTFT_P50_S)
    assert latency.ttft_p99_s == pytest.approx(TTFT_P99_S)
    assert latency.itl_p50_s == pytest.approx(ITL_P50_S)
    assert latency.itl_p99_s == pytest.approx(ITL_P99_S)
    assert latency.queue_length is None  # the gateway's alias has no scheduler queue


def test_histograms_without_a_class_label_report_for_all_classes():
    view = make_view(with_class=False, with_itl=False)
    latency = row(view.classes, model="llama", service_class="all")
    assert latency.ttft_p50_s == pytest.approx(TTFT_P50_S)
    assert (latency.itl_p50_s, latency.itl_p99_s) == (None, None)


def test_output_tokens_per_second_from_the_replicas_counter():
    view = make_view()
    model = row(view.models, model="llama-v1")
    assert model.output_tokens_per_s == pytest.approx(400.0)
    assert model.generated_tokens == 5800
    assert (model.overload_stage, model.overload_stage_name) == (1, "batch_paused")
    assert view.output_tokens_per_s == pytest.approx(400.0)


def test_without_replica_pages_the_routers_token_count_stands_in():
    def without_replicas(after: bool):
        return tuple(s for s in fleet(after) if s.target not in (REPLICA_0, REPLICA_1))

    view = build_view(without_replicas(False), without_replicas(True), INTERVAL_S)
    assert row(view.models, model="llama").output_tokens_per_s == pytest.approx(400.0)  # 800 tokens / 2 s


def test_replica_kv_occupancy_and_load_from_its_own_page():
    replica = row(make_view().replicas, replica="replica-0")
    assert replica.source == "replica" and replica.model == "llama-v1" and replica.ready is True
    assert (replica.kv_free_blocks, replica.kv_used_blocks, replica.kv_reserved_blocks) == (250, 750, 800)
    assert replica.kv_occupancy == pytest.approx(0.75)
    assert (replica.running, replica.waiting, replica.step_time_s) == (12, 3, 0.042)
    assert replica.output_tokens_per_s == pytest.approx(400.0)


def test_a_replica_whose_page_is_down_shows_the_schedulers_view():
    view = make_view()
    replica = row(view.replicas, replica="replica-1")
    assert replica.source == "scheduler" and replica.ready is None
    assert replica.kv_occupancy == pytest.approx(0.1) and replica.kv_reserved_blocks == 120
    assert (replica.running, replica.step_time_s, replica.output_tokens_per_s) == (None, None, None)
    down = row(view.targets, url=REPLICA_1.url)
    assert not down.up and "refused" in down.error


def test_top_tenants_by_served_token_rate_then_the_rest_as_other():
    tenants = make_view(top_tenants=3).tenants
    assert [t.tenant for t in tenants] == ["acme", "globex", "initech", OTHER_TENANT]
    assert [t.served_tokens_per_s for t in tenants[:3]] == pytest.approx([1000, 500, 250])
    assert tenants[0].reserved_kv_share == pytest.approx(0.4) and tenants[0].active_sequences == 4
    other = tenants[-1]
    # umbrella 50 + hooli 10 + the scheduler's own "other" 5.
    assert other.served_tokens_per_s == pytest.approx(65)
    assert other.reserved_kv_share == pytest.approx(0.05 + 0.01 + 0.02)
    assert other.active_sequences == 4


def test_rejections_from_the_router_when_the_gateway_has_no_rejection_counter():
    view = make_view()
    assert view.rejections_source == "router"
    assert [(r.reason, r.per_s) for r in view.rejections] == [("over_capacity", 3.0), ("tenant_kv_share", 0.5)]


def test_rejections_from_the_gateway_when_it_counts_them():
    view = make_view(with_rejections=True)
    assert view.rejections_source == "gateway"
    # Summed over the tenant label: (20 + 4) / 2 s and 6 / 2 s.
    assert [(r.reason, r.per_s) for r in view.rejections] == [("rate_limit_exceeded", 12.0), ("over_capacity", 3.0)]


def test_absent_families_are_none():
    bare = parse_page("# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 1.5\n")
    scrape = tuple(TargetScrape(t, bare) for t in (SCHEDULER, GATEWAY))
    view = build_view(scrape, scrape, INTERVAL_S)
    assert (view.classes, view.replicas, view.tenants, view.models, view.rejections) == ((), (), (), (), ())
    assert (view.output_tokens_per_s, view.replicas_ready, view.rejections_source) == (None, None, None)
    no_step = (TargetScrape(REPLICA_0, parse_page(replica_text(True, with_step_time=False))),)
    assert row(build_view(no_step, no_step, INTERVAL_S).replicas, replica="replica-0").step_time_s is None


def test_a_target_down_in_the_first_scrape_gives_no_rates():
    first = tuple(TargetScrape(s.target, None, "timeout") if s.target == REPLICA_0 else s for s in fleet(False))
    view = build_view(first, fleet(True), INTERVAL_S)
    replica = row(view.replicas, replica="replica-0")
    # Its lifetime 5800 tokens are not one interval's worth.
    assert replica.output_tokens_per_s is None and replica.generated_tokens == 5800
    assert row(view.models, model="llama-v1").output_tokens_per_s is None


def test_a_counter_reset_counts_its_new_value_as_the_increase():
    before = (TargetScrape(REPLICA_0, parse_page(replica_text(True))),)  # 5800
    after = (TargetScrape(REPLICA_0, parse_page(replica_text(False).replace("5000", "100"))),)  # restarted: 100
    assert row(build_view(before, after, INTERVAL_S).replicas, replica="replica-0").output_tokens_per_s == 50.0


def test_an_interval_that_is_not_positive_is_refused():
    with pytest.raises(ValueError):
        build_view(fleet(False), fleet(True), 0.0)
