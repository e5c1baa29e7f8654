"""Every service answers grpc.health.v1 (or HTTP health for the gateway)."""

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.stack

SERVICES = {
    "router": "sluice.v1.Router",
    "scheduler": "sluice.v1.Scheduler",
    "replica": "sluice.v1.Replica",
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_grpc_health_reports_serving(stack, service):
    port = getattr(stack.ports, service)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICES[service]):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("path", ["/healthz", "/health", "/readyz", "/readyz/route"])
def test_gateway_http_health(stack, path):
    response = httpx.get(stack.gateway_url + path, timeout=5)
    assert response.status_code == 200


def test_gateway_serves_prometheus_metrics(stack):
    text = httpx.get(stack.gateway_url + "/metrics", timeout=5).text
    assert "sluice_gateway_requests_total" in text
