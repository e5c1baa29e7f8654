"""python -m sluice.router"""

import asyncio
import logging
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from sluice.router.catalog import parse_catalog, single_model_catalog
from sluice.router.catalog_watch import CatalogFile, CatalogWatch, publish
from sluice.router.live_models import LiveModels
from sluice.router.metrics import RouterMetrics
from sluice.router.models import ModelRegistry
from sluice.router.recent_assignments import RecentAssignments
from sluice.router.placement_client import PlacementClient
from sluice.router.relay import Relay
from sluice.router.replica_channels import ReplicaChannels
from sluice.router.servicer import RouterServicer
from sluice.router.settings import RouterSettings
from sluice.router.cache_scope import CacheScope
from sluice.router.tenant_gate import TenantGate
from sluice.rpc.channels import insecure_channel
from sluice.rpc.health_names import ROUTER_HAS_ROUTE, SCHEDULER_HAS_READY_REPLICA
from sluice.rpc.server import HealthServer, wait_for_stop_signal
from sluice.v1 import common_pb2, router_pb2, router_pb2_grpc
from sluice.telemetry.process import freeze_startup_heap, service_telemetry

log = logging.getLogger("sluice.router")


def build_models(settings: RouterSettings, metrics: RouterMetrics) -> tuple[LiveModels, CatalogWatch | None]:
    """The start-up registry (an invalid catalog stops the router here) and,
    with a models file to re-read, its watch."""
    assignments = RecentAssignments(settings.sticky_assignment_ttl_s, settings.sticky_assignment_max_entries)
    if not settings.models_file:
        catalog = single_model_catalog(settings.model_name, settings.model_version, Path(settings.model_dir))
        live = LiveModels(ModelRegistry(catalog, created_unix_s=time.time()), assignments)
        publish(metrics, live.current, live.generation, 0, time.time())
        return live, None
    path = Path(settings.models_file)
    try:
        found = CatalogFile.read(path)
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"invalid model catalog {path}: {error}") from error
    live = LiveModels(ModelRegistry(parse_catalog(found.text, str(path)), created_unix_s=time.time()), assignments)
    publish(metrics, live.current, live.generation, found.hash_value, time.time())
    if not settings.catalog_reload_interval_s:
        return live, None
    return live, CatalogWatch(path, live, metrics, settings.catalog_reload_interval_s, found)


async def serve(settings: RouterSettings) -> None:
    metrics = RouterMetrics.create()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=metrics.registry)
    models, catalog_watch = build_models(settings, metrics)
    placement = PlacementClient(settings.scheduler_address)
    replicas = ReplicaChannels(settings.stream_buffer_events)
    caps = {
        common_pb2.SERVICE_CLASS_UNSPECIFIED: settings.interactive_max_prompt_tokens,
        common_pb2.SERVICE_CLASS_INTERACTIVE: settings.interactive_max_prompt_tokens,
        common_pb2.SERVICE_CLASS_BATCH: settings.batch_max_prompt_tokens,
    }
    relay = Relay(
        models, placement, replicas, metrics, settings.placement_timeout_s, caps, settings.kv_block_size_tokens,
        TenantGate(settings.tokenize_per_tenant), settings.stream_stall_timeout_s,
        CacheScope(shared=settings.prefix_cache_scope == "shared", groups=settings.prefix_cache_groups),
    )
    servicer = RouterServicer(relay, models)
    server = HealthServer(
        [router_pb2.DESCRIPTOR.services_by_name["Router"].full_name],
        lambda s: router_pb2_grpc.add_RouterServicer_to_server(servicer, s),
    )
    placement.start()
    port = await server.start(settings.router_address)
    readiness = asyncio.create_task(_report_readiness(server, placement, settings.scheduler_address))
    watching = asyncio.create_task(catalog_watch.run()) if catalog_watch else None
    log.info("router serving on port %d; models %s%s", port, sorted(models.current.aliases),
             f"; re-reading {settings.models_file} every {settings.catalog_reload_interval_s:g}s" if watching else "")
    freeze_startup_heap()
    await wait_for_stop_signal()
    log.info("stopping")
    readiness.cancel()
    if watching:
        watching.cancel()
    await server.stop(settings.shutdown_grace_s)
    await placement.stop()
    await replicas.close()


async def _report_readiness(
    server: HealthServer, placement: PlacementClient, scheduler_address: str, interval_s: float = 0.5
) -> None:
    """ROUTER_HAS_ROUTE follows the placement stream and the scheduler's
    ready-replica condition; the gateway's /readyz/route asks for it."""
    channel = insecure_channel(scheduler_address)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        while True:
            try:
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service=SCHEDULER_HAS_READY_REPLICA), timeout=2.0
                )
                has_replica = reply.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.aio.AioRpcError:
                has_replica = False
            await server.set_status(ROUTER_HAS_ROUTE, placement.connected and has_replica)
            await asyncio.sleep(interval_s)
    finally:
        await channel.close()


def main() -> None:
    settings = RouterSettings()
    with service_telemetry("router", settings.log_level, settings.log_format):
        asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
