"""Admission, dispatch and engine knobs: the chart renders every one the
scheduler reads, its defaults are the code's, and what it renders the
services parse as meant."""

from __future__ import annotations

import pytest

pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import (  # noqa: E402
    containers,
    deployments,
    env_of,
    env_values,
    example_values,
    render_objects,
    the_deployment,
)

# Fields every service shares, or that the chart sets from its topology
# (replica discovery: test_chart_control_plane.py).
_NOT_ADMISSION_KNOBS = {"replica_addresses", "router_address", "scheduler_address", "metrics_host", "metrics_port",
                        "shutdown_grace_s", "model_dir", "model_name", "model_version", "log_level",
                        "stream_buffer_events", "replica_discovery", "replica_services", "kubernetes_namespace",
                        "replica_port_name", "replica_resync_s"}


@pytest.fixture(scope="module")
def default_objects() -> list[dict]:
    return render_objects(None)


def knob(text: str) -> int:
    """A DEVICE_DEFAULTS knob as the chart renders it: a count, or a flag
    ("true"/"false", which the replica's settings read as 1/0)."""
    flags = {"true": 1, "false": 0}
    return flags[text] if text in flags else int(text)


def _scheduler_settings_from(objects: list[dict], monkeypatch: pytest.MonkeyPatch):
    from sluice.scheduler.settings import SchedulerSettings

    for name, value in env_values(containers(the_deployment(objects, "scheduler"))[0]).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLUICE_KUBERNETES_NAMESPACE", "sluice")  # the downward API's value
    return SchedulerSettings()


def test_the_scheduler_gets_every_admission_knob(default_objects: list[dict]) -> None:
    from sluice.scheduler.settings import SchedulerSettings

    env = env_of(containers(the_deployment(default_objects, "scheduler"))[0])
    knobs = {f"SLUICE_{name.upper()}" for name in SchedulerSettings.model_fields} - {
        f"SLUICE_{name.upper()}" for name in _NOT_ADMISSION_KNOBS
    }
    assert knobs <= set(env), sorted(knobs - set(env))


def test_the_charts_default_knobs_are_the_codes(default_objects: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.replica.settings import DEVICE_DEFAULTS, ReplicaSettings
    from sluice.router.settings import RouterSettings
    from sluice.scheduler.settings import SchedulerSettings

    code = SchedulerSettings()
    rendered = _scheduler_settings_from(default_objects, monkeypatch)
    assert rendered.placement_config() == code.placement_config()
    assert rendered.schedule_interval_s == code.schedule_interval_s

    router_env = env_values(containers(the_deployment(default_objects, "router"))[0])
    for name in ("kv_block_size_tokens", "tokenize_per_tenant"):
        assert int(router_env[f"SLUICE_{name.upper()}"]) == RouterSettings.model_fields[name].default
    assert router_env["SLUICE_PREFIX_CACHE_SCOPE"] == RouterSettings.model_fields["prefix_cache_scope"].default
    for deployment in deployments(default_objects, "replica"):
        env = env_values(containers(deployment)[0])
        assert float(env["SLUICE_INTERACTIVE_PREEMPT_AFTER_S"]) == ReplicaSettings.model_fields[
            "interactive_preempt_after_s"].default
        for name in ("max_long_prefills_per_step",):
            assert int(env[f"SLUICE_{name.upper()}"]) == ReplicaSettings.model_fields[name].default
        # The chunk caps' code defaults depend on the device: the chart states the ones for its device.
        rendered = ReplicaSettings(device=env["SLUICE_DEVICE"])
        for name in DEVICE_DEFAULTS:
            assert knob(env[f"SLUICE_{name.upper()}"]) == rendered.for_device(name)


def test_the_cpu_example_states_the_replicas_cpu_defaults() -> None:
    from sluice.replica.settings import DEVICE_DEFAULTS, ReplicaSettings

    (deployment,) = deployments(render_objects(example_values("cpu")), "replica")
    env = env_values(containers(deployment)[0])
    rendered = ReplicaSettings(device=env["SLUICE_DEVICE"])
    for name in DEVICE_DEFAULTS:
        assert knob(env[f"SLUICE_{name.upper()}"]) == rendered.for_device(name)


def test_tenant_limits_render_as_json_the_scheduler_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.admission.tenant_caps import TenantLimits

    values = example_values()
    values["scheduler"]["admission"]["tenantMaxActiveSeqs"] = 100
    values["scheduler"]["admission"]["tenantLimits"] = {
        "acme": {"max_active_seqs": 64, "max_kv_share": 0.8},
        "tiny": {"max_kv_share": 0.1},
    }
    tenants = _scheduler_settings_from(render_objects(values), monkeypatch).placement_config().tenants
    assert tenants.for_tenant("acme") == TenantLimits(max_active_seqs=64, max_kv_share=0.8)
    assert tenants.for_tenant("tiny") == TenantLimits(max_active_seqs=100, max_kv_share=0.1)
    assert tenants.for_tenant("anyone") == TenantLimits(max_active_seqs=100, max_kv_share=0.5)


def test_replica_preemption_can_be_turned_off_per_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.replica.settings import ReplicaSettings

    values = example_values()
    values["modelVersions"][0]["interactivePreemptAfterS"] = "none"
    values["modelVersions"][1]["interactivePreemptAfterS"] = 1.5
    by_version = {
        env_values(containers(d)[0])["SLUICE_MODEL_VERSION"]: env_values(containers(d)[0])
        for d in deployments(render_objects(values), "replica")
    }
    expected = {values["modelVersions"][0]["version"]: None, values["modelVersions"][1]["version"]: 1.5}
    for version, after_s in expected.items():
        monkeypatch.setenv("SLUICE_INTERACTIVE_PREEMPT_AFTER_S", by_version[version]["SLUICE_INTERACTIVE_PREEMPT_AFTER_S"])
        assert ReplicaSettings().interactive_preempt_after_s == after_s
