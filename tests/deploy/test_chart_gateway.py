"""The gateway as the chart deploys it: its backends and data volume (or a
render failure naming what is missing), readiness on its own dependencies,
metrics on their own port, no dev key, and its limits while Redis is away."""

from __future__ import annotations

from pathlib import Path

import pytest

helm = pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import (  # noqa: E402
    containers,
    env_of,
    env_values,
    example_values,
    of_kind,
    port_of,
    render,
    render_objects,
    the_deployment,
    volumes_by_name,
)

EXTERNAL = {"backends": {"database": "external", "limits": "redis"}, "secrets": {"existingSecret": "backends"},
            "gateway": {"storage": {"type": "emptyDir"}}}


def gateway_container(objects: list[dict]) -> dict:
    (container,) = containers(the_deployment(objects, "gateway"))
    return container


@pytest.fixture(scope="module")
def default_objects() -> list[dict]:
    return render_objects(None)


@pytest.fixture(scope="module")
def production_objects() -> list[dict]:
    return render_objects(example_values())


# ---- backends and storage --------------------------------------------------------


def test_by_default_one_gateway_keeps_outbox_and_sqlite_ledger_on_its_own_claim(default_objects) -> None:
    gateway = the_deployment(default_objects, "gateway")
    assert gateway["spec"]["replicas"] == 1
    assert gateway["spec"]["strategy"] == {"type": "Recreate"}  # the RWO claim moves with the pod
    container = gateway_container(default_objects)
    env = env_values(container)
    (data_mount,) = [m for m in container["volumeMounts"] if m["name"] == "data"]
    data_dir = data_mount["mountPath"]
    assert env["SLUICE_OUTBOX_PATH"] == f"{data_dir}/gateway-outbox.db"
    assert env["SLUICE_DATABASE_URL"] == f"sqlite:///{data_dir}/ledger.db"
    assert "REDIS_URL" not in env_of(container)
    claim_name = volumes_by_name(gateway)["data"]["persistentVolumeClaim"]["claimName"]
    (claim,) = of_kind(default_objects, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == claim_name
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_gateway_resolves_its_files_under_the_data_volume(default_objects, monkeypatch) -> None:
    """What the gateway's own settings make of the rendered env: nothing
    lands under the read-only root (the image's working directory)."""
    from sluice.gateway.settings import GatewaySettings

    container = gateway_container(default_objects)
    for name, value in env_values(container).items():
        monkeypatch.setenv(name, value)
    settings = GatewaySettings()
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    for path in (Path(settings.outbox_path), Path(settings.database_url.removeprefix("sqlite:///"))):
        assert path.is_absolute()
        assert any(path.is_relative_to(mount) for mount in writable), path


def test_an_existing_claim_is_used_and_none_created() -> None:
    objects = render_objects({"gateway": {"storage": {"persistentVolumeClaim": {"existingClaim": "mine"}}}})
    gateway = the_deployment(objects, "gateway")
    assert volumes_by_name(gateway)["data"]["persistentVolumeClaim"]["claimName"] == "mine"
    assert not of_kind(objects, "PersistentVolumeClaim")


def test_external_backends_are_required_secret_refs_and_the_outbox_an_empty_dir(production_objects) -> None:
    values = example_values()
    env = env_of(gateway_container(production_objects))
    secret = values["secrets"]["existingSecret"]
    assert env["SLUICE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "SLUICE_DATABASE_URL"}
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "REDIS_URL"}
    gateway = the_deployment(production_objects, "gateway")
    assert volumes_by_name(gateway)["data"]["emptyDir"] == {"sizeLimit": "2Gi"}
    assert "strategy" not in gateway["spec"]  # RollingUpdate: nothing pins a pod to a node
    assert not of_kind(production_objects, "PersistentVolumeClaim")


@pytest.mark.parametrize(("values", "message"), [
    ({"gateway": {"replicas": 3}}, "gateway.replicas=3 needs backends.database=external"),
    ({"gateway": {"replicas": 2}, "backends": {"database": "external", "limits": "process"},
      "secrets": {"existingSecret": "s"}}, "every tenant would get 2 times"),
    ({"gateway": {"autoscaling": {"enabled": True}}}, r"gateway.autoscaling \(up to 6 pods\) needs"),
    ({"backends": {"database": "external", "limits": "process"}}, "set secrets.existingSecret"),
    ({"gateway": {"replicas": 2, "storage": {"type": "persistentVolumeClaim"}},
      "backends": {"database": "external", "limits": "redis"}, "secrets": {"existingSecret": "s"}},
     "one ReadWriteOnce claim holds one gateway's outbox"),
    ({"gateway": {"storage": {"type": "emptyDir"}}}, "would lose the usage ledger"),
], ids=["replicas-on-sqlite", "replicas-without-redis", "autoscaling-on-defaults", "external-without-secret",
        "claim-shared-by-replicas", "ephemeral-ledger"])
def test_the_chart_refuses_backends_that_would_silently_misbehave(values, message) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render.render_documents(values)


def test_an_ephemeral_sqlite_ledger_renders_when_asked_for() -> None:
    objects = render_objects({"gateway": {"storage": {"type": "emptyDir", "allowEphemeralLedger": True}}})
    assert "emptyDir" in volumes_by_name(the_deployment(objects, "gateway"))["data"]


def test_autoscaled_gateways_get_an_hpa_and_no_fixed_count(production_objects) -> None:
    values = example_values()["gateway"]["autoscaling"]
    gateway = the_deployment(production_objects, "gateway")
    assert "replicas" not in gateway["spec"]
    (hpa,) = of_kind(production_objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": gateway["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (values["minReplicas"], values["maxReplicas"])


def test_each_gateway_keeps_its_share_of_the_limits_while_redis_is_away(production_objects) -> None:
    # Shares of the most pods the HPA may run: together never above a limit.
    env = env_values(gateway_container(production_objects))
    assert env["SLUICE_LIMITS_FALLBACK_GATEWAYS"] == str(example_values()["gateway"]["autoscaling"]["maxReplicas"])
    fixed = render_objects({**EXTERNAL, "gateway": {"replicas": 3, "storage": {"type": "emptyDir"}}})
    assert env_values(gateway_container(fixed))["SLUICE_LIMITS_FALLBACK_GATEWAYS"] == "3"


# ---- probes, metrics, keys -----------------------------------------------------------


def test_gateway_probes_are_http_healthz_and_readyz(default_objects) -> None:
    container = gateway_container(default_objects)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # /readyz is the gateway's own dependencies (not /readyz/route): it stays
    # in its Service, answering 503 + Retry-After, while no replica is ready.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_gateway_metrics_are_on_their_own_port_not_the_public_one(default_objects, monkeypatch) -> None:
    from sluice.gateway.settings import GatewaySettings

    container = gateway_container(default_objects)
    metrics_port = port_of(container, "metrics")
    assert metrics_port != port_of(container, "http")
    for name, value in env_values(container).items():
        monkeypatch.setenv(name, value)
    settings = GatewaySettings()
    assert (settings.metrics_port, settings.metrics_host) == (metrics_port, "0.0.0.0")
    (service,) = [s for s in of_kind(default_objects, "Service") if s["metadata"]["name"].endswith("-gateway")]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]  # the public Service has no metrics


def test_the_gateway_gets_no_dev_api_key(default_objects, monkeypatch) -> None:
    env = env_of(gateway_container(default_objects))
    assert env["SLUICE_DEV_API_KEY"] == {"name": "SLUICE_DEV_API_KEY", "value": ""}
    # Empty rather than unset, because unset falls back to the built-in dev key.
    from sluice.gateway.settings import GatewaySettings

    monkeypatch.setenv("SLUICE_DEV_API_KEY", env["SLUICE_DEV_API_KEY"]["value"])
    assert not GatewaySettings().dev_api_key


def test_behind_the_clusters_ingress_the_gateway_limits_no_client_address(default_objects) -> None:
    env = env_values(gateway_container(default_objects))
    assert env["SLUICE_HTTP_MAX_CONNECTIONS_PER_CLIENT"] == "0"  # every connection is the ingress's
