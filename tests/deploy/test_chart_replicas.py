"""Replica Deployments as the chart renders them: one per model version with
its Service and PDB, GPUs (or none on CPU), probes that agree with the
rollout deadline, spread and priority, and the KEDA scaler per version."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import (  # noqa: E402
    GRPC_ROLES,
    component,
    containers,
    deployments,
    env_of,
    example_values,
    of_kind,
    pod_spec,
    port_of,
    render_objects,
    renderings,
    selector_of,
    workloads,
)

RENDERINGS = renderings()


@pytest.fixture(scope="module")
def production_objects() -> list[dict]:
    return render_objects(example_values())


def startup_budget_s(container: dict) -> int:
    startup, readiness = container["startupProbe"], container["readinessProbe"]
    return (startup["periodSeconds"] * startup["failureThreshold"]
            + readiness["periodSeconds"] * readiness["failureThreshold"])


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_the_rollout_deadline_outlasts_the_startup_probe(rendering: str) -> None:
    replica_deployments = deployments(render_objects(RENDERINGS[rendering]()), "replica")
    assert replica_deployments
    for deployment in replica_deployments:
        (container,) = containers(deployment)
        # Kubernetes' default (600 s) would mark a rollout failed while a pod
        # is still inside its startup probe.
        assert deployment["spec"]["progressDeadlineSeconds"] > startup_budget_s(container)


def test_the_deadline_follows_the_probe_values() -> None:
    values = {"replicaDefaults": {"probes": {"startup": {"periodSeconds": 20, "failureThreshold": 100}},
                                  "progressMarginSeconds": 60}}
    (deployment,) = deployments(render_objects(values), "replica")
    assert deployment["spec"]["progressDeadlineSeconds"] == 20 * 100 + 5 * 2 + 60


def test_every_replica_deployment_requests_a_gpu_and_nothing_else_does(production_objects) -> None:
    for workload in workloads(production_objects):
        for container in containers(workload):
            resources = container["resources"]
            if component(workload) == "replica":
                assert resources["requests"]["nvidia.com/gpu"] >= 1
                assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
            else:
                assert "nvidia.com/gpu" not in resources.get("requests", {})
                assert "nvidia.com/gpu" not in resources.get("limits", {})


def test_the_cpu_example_asks_for_no_gpu_and_tolerates_no_gpu_taint() -> None:
    (deployment,) = deployments(render_objects(example_values("cpu")), "replica")
    (container,) = containers(deployment)
    assert "nvidia.com/gpu" not in container["resources"]["requests"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert env_of(container)["SLUICE_DEVICE"]["value"] == "cpu"
    assert "tolerations" not in pod_spec(deployment)


def test_every_grpc_container_has_native_grpc_probes(production_objects) -> None:
    for role in GRPC_ROLES:
        for deployment in deployments(production_objects, role):
            # The role's own container (the router's tokenizer-sync sidecar
            # serves no gRPC; its exec probes: test_chart_tokenizer_sync.py).
            (container,) = [c for c in containers(deployment) if c["name"] == role]
            grpc_port = port_of(container, "grpc")
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["grpc"] == {"port": grpc_port}, (role, probe)


def test_replica_probes_wait_for_model_load_and_restart_later_than_they_unready(production_objects) -> None:
    for deployment in deployments(production_objects, "replica"):
        (container,) = containers(deployment)
        startup, readiness, liveness = (container[p] for p in ("startupProbe", "readinessProbe", "livenessProbe"))
        assert startup["grpc"] == {"port": port_of(container, "grpc")}
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model load
        assert liveness["periodSeconds"] * liveness["failureThreshold"] > (
            readiness["periodSeconds"] * readiness["failureThreshold"]
        )


def test_termination_grace_exceeds_the_shutdown_grace(production_objects) -> None:
    for workload in workloads(production_objects):
        pod = pod_spec(workload)
        (container,) = [c for c in pod["containers"] if c["name"] == component(workload)]  # the role's own
        shutdown_grace_s = float(env_of(container)["SLUICE_SHUTDOWN_GRACE_S"]["value"])
        assert pod["terminationGracePeriodSeconds"] > shutdown_grace_s, workload["metadata"]["name"]


def test_one_replica_deployment_headless_service_and_pdb_per_model_version(production_objects) -> None:
    versions = [v["version"] for v in example_values()["modelVersions"]]
    by_version = {
        kind: sorted(o["metadata"]["labels"]["sluice.dev/model-version"]
                     for o in of_kind(production_objects, kind) if component(o) == "replica")
        for kind in ("Deployment", "Service", "PodDisruptionBudget")
    }
    assert by_version == {kind: sorted(versions) for kind in by_version}
    for service in of_kind(production_objects, "Service"):
        if component(service) == "replica":
            assert service["spec"]["clusterIP"] == "None"
            # Unready pods stay in the slices marked unready (true would mark them ready).
            assert service["spec"]["publishNotReadyAddresses"] is False
        else:
            assert service["spec"]["type"] == "ClusterIP"
    for deployment in deployments(production_objects, "replica"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector["sluice.dev/model-version"] == deployment["metadata"]["labels"]["sluice.dev/model-version"]


def test_replica_env_configures_the_gpu_engine(production_objects) -> None:
    for deployment in deployments(production_objects, "replica"):
        (container,) = containers(deployment)
        env = env_of(container)
        assert env["SLUICE_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["SLUICE_DEVICE"]["value"] == "cuda"
        assert env["SLUICE_DTYPE"]["value"] == "bfloat16"
        assert env["SLUICE_KV_CACHE_BYTES"]["value"] == "0"
        assert 0 < float(env["SLUICE_GPU_MEMORY_FRACTION"]["value"]) <= 1
        assert env["SLUICE_REPLICA_ADDRESS"]["value"] == f"0.0.0.0:{port_of(container, 'grpc')}"
        assert env["SLUICE_MODEL_VERSION"]["value"] == deployment["metadata"]["labels"]["sluice.dev/model-version"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/models"]["readOnly"] is True


def test_replicas_spread_over_the_topology_with_their_own_version_selector(production_objects) -> None:
    keys = [c["topologyKey"] for c in example_values()["replicaDefaults"]["topologySpreadConstraints"]]
    for deployment in deployments(production_objects, "replica"):
        constraints = pod_spec(deployment)["topologySpreadConstraints"]
        assert [c["topologyKey"] for c in constraints] == keys
        for constraint in constraints:
            # Each version spreads its own pods, not all replicas together.
            assert constraint["labelSelector"]["matchLabels"] == selector_of(deployment)


def test_replicas_run_at_the_created_priority_class(production_objects) -> None:
    (priority_class,) = of_kind(production_objects, "PriorityClass")
    assert priority_class["value"] > 0 and priority_class["globalDefault"] is False
    for deployment in deployments(production_objects, "replica"):
        assert pod_spec(deployment)["priorityClassName"] == priority_class["metadata"]["name"]
    for role in ("gateway", "router", "scheduler"):
        (workload,) = deployments(production_objects, role)
        assert "priorityClassName" not in pod_spec(workload)
    assert not of_kind(render_objects(None), "PriorityClass")


def test_a_scaled_object_per_autoscaled_version_on_queue_age_and_kv_occupancy(production_objects) -> None:
    values = example_values()
    scaled = {o["metadata"]["labels"]["sluice.dev/model-version"]: o for o in of_kind(production_objects, "ScaledObject")}
    expected = {"llama-3.1-8b-instruct-v1", "llama-3.1-8b-instruct-v2"}  # the L4 model opts out
    assert set(scaled) == expected
    replica_deployments = {d["metadata"]["labels"]["sluice.dev/model-version"]: d
                           for d in deployments(production_objects, "replica")}
    for version, scaler in scaled.items():
        assert scaler["apiVersion"] == "keda.sh/v1alpha1"
        deployment = replica_deployments[version]
        assert scaler["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"]  # a helm upgrade must not undo the scaler
        triggers = {t["name"]: t for t in scaler["spec"]["triggers"]}
        assert set(triggers) == {"queue-age", "kv-occupancy"}
        for trigger in triggers.values():
            assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
            assert f'model="{version}"' in trigger["metadata"]["query"]
            assert 'namespace="sluice"' in trigger["metadata"]["query"]
            float(trigger["metadata"]["threshold"])
        assert "sluice_queue_oldest_age_seconds" in triggers["queue-age"]["metadata"]["query"]
        assert "sluice_kv_blocks" in triggers["kv-occupancy"]["metadata"]["query"]
    assert (scaled["llama-3.1-8b-instruct-v1"]["spec"]["minReplicaCount"],
            scaled["llama-3.1-8b-instruct-v1"]["spec"]["maxReplicaCount"]) == (2, 6)
    assert "replicas" in replica_deployments["qwen2.5-0.5b-instruct"]["spec"]
    assert values["replicaDefaults"]["autoscaling"]["enabled"] is True


def test_the_scalers_query_metrics_the_services_export(production_objects) -> None:
    """Every metric a trigger selects is one the scheduler or a replica
    exports, with every label the selector names (but namespace, which the
    scrape adds): real collectors, scraped once."""
    from sluice.replica.engine_loop import EngineSnapshot
    from sluice.replica.metrics import ReplicaCollector, ReplicaCounters
    from sluice.scheduler.metrics import SchedulerMetrics

    snapshot = EngineSnapshot(total_kv_blocks=8, free_kv_blocks=3, block_size_tokens=16, num_running=1,
                              num_waiting=0, step_time_s=0.01, steps_total=1, generated_tokens_total=1,
                              preemptions_total=0, last_step_at_s=0.0)
    replica = ReplicaCollector("r0", "v1", lambda: snapshot, ReplicaCounters(), lambda: True)
    scheduler = SchedulerMetrics.create()
    scheduler.queue_oldest_age_seconds.labels("v1", "interactive").set(0.5)
    exported: dict[str, set[str]] = {}
    for family in [*replica.collect(), *scheduler.registry.collect()]:
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    (scaler, *_) = of_kind(production_objects, "ScaledObject")
    for trigger in scaler["spec"]["triggers"]:
        for name, matchers in re.findall(r"(sluice_\w+)\{([^}]*)\}", trigger["metadata"]["query"]):
            labels = {m.split("=")[0].rstrip("!~").strip() for m in matchers.split(",")} - {"namespace"}
            assert name in exported, name
            assert labels <= exported[name], (name, labels - exported[name])
