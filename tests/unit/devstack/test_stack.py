"""LocalStack's wiring for N replicas, checked without starting anything."""

from pathlib import Path

import pytest

from sluice.devstack.stack import LocalStack, StackPorts, replica_name


def make_stack(num_replicas: int, **kwargs) -> LocalStack:
    return LocalStack(model_dir=Path("/models/tiny"), log_dir=Path("/tmp/logs"), num_replicas=num_replicas,
                      **kwargs)


def test_one_replica_keeps_the_old_names_and_ports():
    stack = make_stack(1)
    env = stack.environment("replica")
    assert env["SLUICE_REPLICA_ADDRESS"] == "127.0.0.1:50061"
    assert env["SLUICE_METRICS_PORT"] == "9061"
    assert env["SLUICE_REPLICA_ID"] == "replica-0"
    assert stack.environment("scheduler")["SLUICE_REPLICA_ADDRESSES"] == "127.0.0.1:50061"
    assert stack.metrics_url("replica") == "http://127.0.0.1:9061/metrics"
    assert replica_name(0) == "replica"


def test_each_replica_has_its_own_ports_and_id_and_the_scheduler_watches_all():
    stack = make_stack(3, ports=StackPorts.ephemeral(num_replicas=3))
    envs = [stack.environment("replica", i) for i in range(3)]
    addresses = [env["SLUICE_REPLICA_ADDRESS"] for env in envs]
    metrics_ports = [env["SLUICE_METRICS_PORT"] for env in envs]
    assert len(set(addresses)) == 3 and len(set(metrics_ports)) == 3
    assert [env["SLUICE_REPLICA_ID"] for env in envs] == ["replica-0", "replica-1", "replica-2"]
    assert stack.environment("scheduler")["SLUICE_REPLICA_ADDRESSES"] == ",".join(addresses)
    assert [stack.metrics_url("replica", i) for i in range(3)] == [
        f"http://127.0.0.1:{port}/metrics" for port in metrics_ports
    ]
    ports = StackPorts.ephemeral(num_replicas=3)
    every = [ports.gateway, ports.router, ports.scheduler, ports.router_metrics, ports.scheduler_metrics,
             *(ports.replica_port(i) for i in range(3)), *(ports.replica_metrics_port(i) for i in range(3))]
    assert len(set(every)) == len(every)


def test_fixed_ports_count_up_and_missing_ones_are_filled_in():
    assert StackPorts().with_replicas(3).more_replicas == ((50062, 9062), (50063, 9063))
    stack = make_stack(2, ports=StackPorts.ephemeral())  # one replica's ports given, two replicas asked
    assert stack.ports.num_replicas == 2
    assert stack.ports.replica_port(1) != stack.ports.replica_port(0)


def test_replica_env_reaches_only_its_replica_and_wins_over_extra_env():
    stack = make_stack(2, extra_env={"SLUICE_KV_CACHE_BLOCKS": "64"},
                       replica_env={1: {"SLUICE_KV_CACHE_BLOCKS": "32"}})
    assert stack.environment("replica", 0)["SLUICE_KV_CACHE_BLOCKS"] == "64"
    assert stack.environment("replica", 1)["SLUICE_KV_CACHE_BLOCKS"] == "32"
    assert stack.environment("gateway")["SLUICE_KV_CACHE_BLOCKS"] == "64"


def test_bad_replica_counts_are_refused():
    with pytest.raises(ValueError):
        make_stack(0)
    with pytest.raises(ValueError):
        make_stack(2, replica_env={2: {}})
