"""Targets: flags over env over the local stack's ports."""

from sluice.top.targets import TargetKind, metrics_url, resolve_targets


def urls(targets, kind):
    return [t.url for t in targets if t.kind == kind]


def test_local_defaults():
    targets = resolve_targets({})
    assert urls(targets, TargetKind.SCHEDULER) == ["http://127.0.0.1:9052/metrics"]
    assert urls(targets, TargetKind.ROUTER) == ["http://127.0.0.1:9051/metrics"]
    assert urls(targets, TargetKind.GATEWAY) == ["http://127.0.0.1:8000/metrics"]
    assert urls(targets, TargetKind.REPLICA) == ["http://127.0.0.1:9061/metrics"]


def test_flags_win_over_env_and_env_over_defaults():
    env = {"SLUICE_TOP_SCHEDULER_URL": "http://sched:1/metrics", "SLUICE_TOP_GATEWAY_URL": "http://gw:2",
           "SLUICE_TOP_REPLICA_URLS": "http://r0:3/metrics, http://r1:4/metrics"}
    targets = resolve_targets(env, scheduler="http://flag:9/metrics")
    assert urls(targets, TargetKind.SCHEDULER) == ["http://flag:9/metrics"]
    assert urls(targets, TargetKind.GATEWAY) == ["http://gw:2/metrics"]
    assert urls(targets, TargetKind.REPLICA) == ["http://r0:3/metrics", "http://r1:4/metrics"]
    flagged = resolve_targets(env, replicas=["http://r9:5/metrics"])
    assert urls(flagged, TargetKind.REPLICA) == ["http://r9:5/metrics"]


def test_a_bare_address_means_its_metrics_page():
    assert metrics_url("http://h:1") == "http://h:1/metrics"
    assert metrics_url("http://h:1/") == "http://h:1/metrics"
    assert metrics_url("http://h:1/custom") == "http://h:1/custom"
