"""Policies every rendering of the chart keeps (the defaults, each example
and the variants in chart_support.renderings): pinned images, resources and
probes on every long-running container, non-root pods on a read-only root,
no token where no Kubernetes API is called, and every Secret key the chosen
backends need required rather than optional. Pods are those of the
Deployments and of the rollout Job (the two-versions example renders it); a
Job's container runs to completion, so it needs no probes."""

from __future__ import annotations

import pytest

pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import (  # noqa: E402
    CONTROL_PLANE_ROLES,
    all_containers,
    component,
    containers,
    deployments,
    env_of,
    example_values,
    of_kind,
    pod_spec,
    render_objects,
    renderings,
    workloads,
)

RENDERINGS = renderings()


def pod_templates(objects: list[dict]) -> list[dict]:
    """Every object with a pod template: the long-running workloads and the Jobs."""
    return workloads(objects) + of_kind(objects, "Job")


def test_some_rendering_has_a_job() -> None:
    # Otherwise the policies below would check no Job at all.
    assert of_kind(render_objects(example_values("two-versions")), "Job")


@pytest.fixture(scope="module", params=sorted(RENDERINGS))
def rendered(request) -> tuple[dict | None, list[dict]]:
    values = RENDERINGS[request.param]()
    return values, render_objects(values)


def test_images_are_pinned_never_latest_and_pulled_if_not_present(rendered) -> None:
    _, objects = rendered
    for workload in pod_templates(objects):
        for container in all_containers(workload):
            repository, _, tag = container["image"].rpartition(":")
            assert repository and tag and tag != "latest", container["image"]
            assert "@" not in tag
            assert container["imagePullPolicy"] == "IfNotPresent"


def test_every_container_has_resources_and_every_long_running_one_probes(rendered) -> None:
    _, objects = rendered
    for workload in pod_templates(objects):
        for container in all_containers(workload):
            resources = container["resources"]
            assert resources["requests"]["cpu"] and resources["requests"]["memory"], container["name"]
            assert resources["limits"]["memory"], container["name"]
    for workload in workloads(objects):  # not Jobs: they run to completion
        for container in containers(workload):  # nor init containers
            assert container["readinessProbe"] and container["livenessProbe"], container["name"]


def test_pods_run_as_non_root_on_a_read_only_root(rendered) -> None:
    _, objects = rendered
    for workload in pod_templates(objects):
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in all_containers(workload):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_only_the_scheduler_and_the_rollout_job_mount_an_api_token(rendered) -> None:
    _, objects = rendered
    for workload in pod_templates(objects):
        pod = pod_spec(workload)
        if component(workload) == "scheduler":
            assert pod["automountServiceAccountToken"] is True
            assert pod["serviceAccountName"] == workload["metadata"]["name"]
        elif workload["kind"] == "Job" and component(workload) == "rollout":
            assert pod["automountServiceAccountToken"] is True
            assert pod["serviceAccountName"] == "sluice-rollout"  # the catalog ConfigMap's Role only
        else:
            assert pod["automountServiceAccountToken"] is False
            assert "serviceAccountName" not in pod


def test_no_secret_key_is_optional(rendered) -> None:
    _, objects = rendered
    for workload in pod_templates(objects):
        for container in all_containers(workload):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert not ref.get("optional", False), (container["name"], env["name"])


def test_every_secret_key_the_chosen_backends_need_is_a_required_ref(rendered) -> None:
    values, objects = rendered
    merged = _backends(values)
    (gateway,) = deployments(objects, "gateway")
    env = env_of(containers(gateway)[0])
    needed = {"SLUICE_DATABASE_URL": merged["database"] == "external", "REDIS_URL": merged["limits"] == "redis"}
    for name, from_secret in needed.items():
        if from_secret:
            ref = env[name]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == values["secrets"]["existingSecret"] and ref["key"]
            assert "optional" not in ref
        else:
            assert "valueFrom" not in env.get(name, {})


def _backends(values: dict | None) -> dict:
    defaults = {"database": "sqlite", "limits": "process"}
    return {**defaults, **((values or {}).get("backends") or {})}


def test_control_plane_images_are_not_the_replica_image() -> None:
    values = example_values()
    objects = render_objects(values)
    images = values["images"]
    control_plane = f"{images['controlPlane']['repository']}:{images['controlPlane']['tag']}"
    replica = f"{images['replica']['repository']}:{images['replica']['tag']}"
    assert control_plane != replica
    for role in CONTROL_PLANE_ROLES:
        (workload,) = deployments(objects, role)
        assert {c["image"] for c in all_containers(workload)} == {control_plane}
    replica_deployments = deployments(objects, "replica")
    assert replica_deployments
    for deployment in replica_deployments:
        assert [c["image"] for c in containers(deployment)] == [replica]
