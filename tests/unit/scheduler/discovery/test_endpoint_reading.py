"""The ready address set read from EndpointSlices (the kubernetes client's
own models), over ready / not-ready / terminating / multi-slice cases."""

import pytest
from kubernetes.client import (
    DiscoveryV1EndpointPort,
    V1Endpoint,
    V1EndpointConditions,
    V1EndpointSlice,
    V1ObjectMeta,
)

from sluice.scheduler.discovery.endpoints import (
    EMPTY_READING,
    EndpointCondition,
    membership_change,
    read_endpoints,
    service_selector,
)


def endpoint(ip: str, ready: bool | None = True, terminating: bool | None = None,
             serving: bool | None = None) -> V1Endpoint:
    return V1Endpoint(addresses=[ip], conditions=V1EndpointConditions(
        ready=ready, terminating=terminating, serving=serving))


def make_slice(name: str, endpoints: list[V1Endpoint], service: str = "replica-v1", port: int = 50061,
               port_name: str | None = "grpc", address_type: str = "IPv4") -> V1EndpointSlice:
    return V1EndpointSlice(
        address_type=address_type,
        metadata=V1ObjectMeta(name=name, labels={"kubernetes.io/service-name": service}),
        endpoints=endpoints,
        ports=[DiscoveryV1EndpointPort(name="metrics", port=9061),
               DiscoveryV1EndpointPort(name=port_name, port=port)],
    )


def test_only_ready_endpoints_on_the_named_port_count():
    reading = read_endpoints([make_slice("a", [
        endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False), endpoint("10.0.0.3", ready=None)])], "grpc")

    assert reading.ready_addresses() == {"10.0.0.1:50061", "10.0.0.3:50061"}  # unset ready means ready
    assert reading.conditions["10.0.0.2:50061"] is EndpointCondition.NOT_READY
    assert reading.services["10.0.0.1:50061"] == "replica-v1"


def test_a_terminating_endpoint_leaves_even_while_it_still_serves():
    reading = read_endpoints([make_slice("a", [
        endpoint("10.0.0.1", ready=True, terminating=True, serving=True), endpoint("10.0.0.2")])], "grpc")

    assert reading.ready_addresses() == {"10.0.0.2:50061"}
    assert reading.conditions["10.0.0.1:50061"] is EndpointCondition.TERMINATING


def test_slices_of_several_services_merge_with_their_own_ports():
    reading = read_endpoints([
        make_slice("v1-a", [endpoint("10.0.0.1")]),
        make_slice("v1-b", [endpoint("10.0.0.2")], port=50071),
        make_slice("v2-a", [endpoint("10.0.1.1")], service="replica-v2"),
    ], "grpc")

    assert reading.ready_addresses() == {"10.0.0.1:50061", "10.0.0.2:50071", "10.0.1.1:50061"}
    assert reading.services["10.0.1.1:50061"] == "replica-v2"


def test_an_address_in_two_slices_counts_only_if_neither_says_it_is_going():
    moving = [make_slice("a", [endpoint("10.0.0.1")]), make_slice("b", [endpoint("10.0.0.1", ready=False)])]

    assert read_endpoints(moving, "grpc").ready_addresses() == frozenset()
    assert read_endpoints(list(reversed(moving)), "grpc").ready_addresses() == frozenset()


def test_a_slice_without_the_port_is_reported_not_guessed():
    reading = read_endpoints([make_slice("a", [endpoint("10.0.0.1")], port_name="http")], "grpc")

    assert reading.ready_addresses() == frozenset()
    assert reading.slices_without_port == ("a",)


def test_an_unnamed_port_matches_the_empty_port_name():
    assert read_endpoints([make_slice("a", [endpoint("10.0.0.1")], port_name=None)], "").ready_addresses() == {
        "10.0.0.1:50061"}


def test_ipv6_addresses_are_bracketed_and_empty_slices_are_fine():
    reading = read_endpoints([
        make_slice("a", [endpoint("fd00::1")], address_type="IPv6"),
        V1EndpointSlice(address_type="IPv4", metadata=V1ObjectMeta(name="empty"), endpoints=None, ports=None),
    ], "grpc")

    assert reading.ready_addresses() == {"[fd00::1]:50061"}
    assert reading.slices_without_port == ("empty",)


def test_membership_change_says_who_joined_and_why_each_left():
    before = read_endpoints([make_slice("a", [endpoint("10.0.0.1"), endpoint("10.0.0.2"), endpoint("10.0.0.3")])],
                            "grpc")
    after = read_endpoints([make_slice("a", [
        endpoint("10.0.0.1", ready=False), endpoint("10.0.0.2", terminating=True), endpoint("10.0.0.4")])], "grpc")

    change = membership_change(before, after)

    assert change.added == ("10.0.0.4:50061",)
    assert change.removed == (("10.0.0.1:50061", "not ready"), ("10.0.0.2:50061", "terminating"),
                              ("10.0.0.3:50061", "gone from the EndpointSlices"))
    assert not membership_change(after, after)
    assert membership_change(EMPTY_READING, before).added == ("10.0.0.1:50061", "10.0.0.2:50061", "10.0.0.3:50061")


def test_the_selector_names_every_service_once():
    assert service_selector(["replica-v2", "replica-v1", "replica-v2"]) == (
        "kubernetes.io/service-name in (replica-v1,replica-v2)")
    with pytest.raises(ValueError, match="at least one Service"):
        service_selector([])
