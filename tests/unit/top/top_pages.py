"""Hand-written /metrics pages of a small fleet, scraped twice 2 s apart,
and the scrapes built from them (no HTTP: the view is pure).

The fleet: one model version "llama-v1" (alias "llama" on the router and
gateway), replica-0 up, replica-1's page down (the scheduler still reports
it), five tenants plus the scheduler's own "other" label.
"""

from sluice.top.exposition import parse_page
from sluice.top.scrape import TargetScrape
from sluice.top.targets import Target, TargetKind

INTERVAL_S = 2.0
SCHEDULER = Target(TargetKind.SCHEDULER, "http://scheduler:9052/metrics")
ROUTER = Target(TargetKind.ROUTER, "http://router:9051/metrics")
GATEWAY = Target(TargetKind.GATEWAY, "http://gateway:8000/metrics")
REPLICA_0 = Target(TargetKind.REPLICA, "http://replica-0:9061/metrics")
REPLICA_1 = Target(TargetKind.REPLICA, "http://replica-1:9061/metrics")

TTFT_LE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30, 60, 120, 300, 600)
ITL_LE = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5)

# Served tokens (the VTC counter) per (class, tenant), before and after:
# per second over the 2 s: acme 1000, globex 500, initech 250 (100
# interactive + 150 batch), umbrella 50, hooli 10, the exported "other" 5.
SERVED_BEFORE = {("interactive", "acme"): 10_000, ("interactive", "globex"): 4_000, ("interactive", "initech"): 700,
                 ("batch", "initech"): 300, ("batch", "umbrella"): 900, ("interactive", "hooli"): 80,
                 ("interactive", "other"): 20}
SERVED_AFTER = {("interactive", "acme"): 12_000, ("interactive", "globex"): 5_000, ("interactive", "initech"): 900,
                ("batch", "initech"): 600, ("batch", "umbrella"): 1_000, ("interactive", "hooli"): 100,
                ("interactive", "other"): 30}
KV_SHARE = {"acme": 0.4, "globex": 0.2, "initech": 0.1, "umbrella": 0.05, "hooli": 0.01, "other": 0.02}
ACTIVE = {"acme": 4, "globex": 2, "initech": 3, "umbrella": 1, "hooli": 1, "other": 2}


def histogram(name: str, labels: str, bounds: tuple[float, ...], cumulative: list[int]) -> str:
    """Bucket lines for `bounds` + +Inf; `cumulative` has one count per bound and one for +Inf."""
    lines = [f"# TYPE {name} histogram"]
    for le, count in zip([*map(str, bounds), "+Inf"], cumulative):
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count}')
    lines.append(f"{name}_count{{{labels}}} {cumulative[-1]}")
    lines.append(f"{name}_sum{{{labels}}} 1.0")
    return "\n".join(lines)


def scheduler_text(after: bool) -> str:
    served = SERVED_AFTER if after else SERVED_BEFORE
    lines = [
        "# TYPE sluice_queue_length gauge",
        'sluice_queue_length{class="interactive",model="llama-v1"} 3',
        'sluice_queue_length{class="batch",model="llama-v1"} 10',
        "# TYPE sluice_queue_oldest_age_seconds gauge",
        'sluice_queue_oldest_age_seconds{class="interactive",model="llama-v1"} 0.75',
        'sluice_queue_oldest_age_seconds{class="batch",model="llama-v1"} 42.5',
        "# TYPE sluice_kv_blocks gauge",
        'sluice_kv_blocks{replica="replica-0",state="free"} 250',
        'sluice_kv_blocks{replica="replica-0",state="used"} 750',
        'sluice_kv_blocks{replica="replica-0",state="reserved"} 800',
        'sluice_kv_blocks{replica="replica-1",state="free"} 900',
        'sluice_kv_blocks{replica="replica-1",state="used"} 100',
        'sluice_kv_blocks{replica="replica-1",state="reserved"} 120',
        "# TYPE sluice_scheduler_replicas_ready gauge",
        "sluice_scheduler_replicas_ready 2",
        "# TYPE sluice_overload_stage gauge",
        'sluice_overload_stage{model="llama-v1"} 1',
        "# TYPE sluice_rejections counter",
        f'sluice_rejections_total{{class="batch",reason="queue_full"}} {8 if after else 0}',
        "# TYPE sluice_tenant_served_tokens counter",
        *(f'sluice_tenant_served_tokens_total{{class="{c}",model="llama-v1",tenant="{t}"}} {v}'
          for (c, t), v in served.items()),
        "# TYPE sluice_tenant_reserved_kv_share gauge",
        *(f'sluice_tenant_reserved_kv_share{{model="llama-v1",tenant="{t}"}} {v}' for t, v in KV_SHARE.items()),
        "# TYPE sluice_tenant_active_sequences gauge",
        *(f'sluice_tenant_active_sequences{{model="llama-v1",tenant="{t}"}} {v}' for t, v in ACTIVE.items()),
    ]
    return "\n".join(lines) + "\n"


def router_text(after: bool) -> str:
    # over_capacity 3/s, tenant_kv_share 0.5/s (the scheduler's queue_full
    # would be among them in a real router; here they differ on purpose,
    # so a test can tell which counter was read).
    return "\n".join([
        "# TYPE sluice_rejections counter",
        f'sluice_rejections_total{{reason="over_capacity"}} {16 if after else 10}',
        f'sluice_rejections_total{{reason="tenant_kv_share"}} {3 if after else 2}',
        "# TYPE sluice_generation_tokens counter",
        f'sluice_generation_tokens_total{{model="llama"}} {900 if after else 100}',
    ]) + "\n"


# Before: 100 slow first tokens, all in the le=5 bucket. Over the
# interval: 2 <= 0.1 s, 5 more <= 0.25, 2 more <= 0.5, 1 more <= 1.
TTFT_BEFORE = [0, 0, 0, 0, 0, 0, 0, 0, 0, 100, 100, 100, 100, 100, 100, 100, 100]
TTFT_DELTA = [0, 0, 0, 2, 7, 9, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10]
# p50: rank 5 of 10 lies in (0.1, 0.25], 3 of its 5: 0.1 + 0.15 * 3/5 = 0.19.
# p99: rank 9.9 lies in (0.5, 1], 0.9 of its 1: 0.5 + 0.5 * 0.9 = 0.95.
TTFT_P50_S, TTFT_P99_S = 0.19, 0.95
# ITL over the interval: 4 <= 0.01, 4 more <= 0.025, 2 more <= 0.05.
ITL_BEFORE = [50] * 11
ITL_DELTA = [0, 4, 8, 10, 10, 10, 10, 10, 10, 10, 10]
# p50: rank 5 in (0.01, 0.025], 1 of 4: 0.01 + 0.015 / 4 = 0.01375.
# p99: rank 9.9 in (0.025, 0.05], 1.9 of 2: 0.025 + 0.025 * 0.95 = 0.04875.
ITL_P50_S, ITL_P99_S = 0.01375, 0.04875


def gateway_text(after: bool, with_class: bool = True, with_itl: bool = True, with_rejections: bool = False) -> str:
    def counts(before: list[int], delta: list[int]) -> list[int]:
        return [b + (d if after else 0) for b, d in zip(before, delta)]

    labels = 'class="interactive",model="llama"' if with_class else 'model="llama"'
    parts = [histogram("sluice_time_to_first_token_seconds", labels, TTFT_LE, counts(TTFT_BEFORE, TTFT_DELTA))]
    if with_itl:
        parts.append(histogram("sluice_inter_token_latency_seconds", labels, ITL_LE, counts(ITL_BEFORE, ITL_DELTA)))
    if with_rejections:
        parts.append("\n".join([
            "# TYPE sluice_gateway_rejections counter",
            f'sluice_gateway_rejections_total{{reason="rate_limit_exceeded",tenant="acme"}} {20 if after else 0}',
            f'sluice_gateway_rejections_total{{reason="rate_limit_exceeded",tenant="other"}} {4 if after else 0}',
            f'sluice_gateway_rejections_total{{reason="over_capacity",tenant="globex"}} {6 if after else 0}',
        ]))
    return "\n".join(parts) + "\n"


def replica_text(after: bool, with_step_time: bool = True) -> str:
    labels = 'model="llama-v1",replica="replica-0"'
    lines = [
        "# TYPE sluice_kv_blocks gauge",
        f'sluice_kv_blocks{{{labels},state="free"}} 250',
        f'sluice_kv_blocks{{{labels},state="used"}} 750',
        "# TYPE sluice_num_requests_running gauge",
        f"sluice_num_requests_running{{{labels}}} 12",
        "# TYPE sluice_num_requests_waiting gauge",
        f"sluice_num_requests_waiting{{{labels}}} 3",
        "# TYPE sluice_replica_ready gauge",
        f"sluice_replica_ready{{{labels}}} 1",
        "# TYPE sluice_replica_generation_tokens counter",
        # 800 tokens in 2 s: 400 tok/s.
        f"sluice_replica_generation_tokens_total{{{labels}}} {5800 if after else 5000}",
    ]
    if with_step_time:
        lines += ["# TYPE sluice_engine_step_time_seconds gauge", f"sluice_engine_step_time_seconds{{{labels}}} 0.042"]
    return "\n".join(lines) + "\n"


def fleet(after: bool, **gateway_options: bool) -> tuple[TargetScrape, ...]:
    """One scrape of the whole fleet; replica-1's page is down."""
    return (
        TargetScrape(SCHEDULER, parse_page(scheduler_text(after))),
        TargetScrape(ROUTER, parse_page(router_text(after))),
        TargetScrape(GATEWAY, parse_page(gateway_text(after, **gateway_options))),
        TargetScrape(REPLICA_0, parse_page(replica_text(after))),
        TargetScrape(REPLICA_1, None, "ConnectError: connection refused"),
    )
