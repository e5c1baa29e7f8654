"""python -m sluice.scheduler"""

import asyncio
import logging
from typing import Any

from prometheus_client import start_http_server

from sluice.placement.cluster import ClusterScheduler
from sluice.rpc.health_names import SCHEDULER_HAS_READY_REPLICA
from sluice.rpc.server import HealthServer, wait_for_stop_signal
from sluice.scheduler.discovery.static import ReplicaDiscovery, StaticDiscovery
from sluice.scheduler.metrics import SchedulerMetrics
from sluice.scheduler.replica_watch import ReplicaWatcher
from sluice.scheduler.servicer import SchedulerServicer
from sluice.scheduler.settings import SchedulerSettings
from sluice.v1 import scheduler_pb2, scheduler_pb2_grpc
from sluice.telemetry.process import freeze_startup_heap, service_telemetry

log = logging.getLogger("sluice.scheduler")


def replica_discovery(settings: SchedulerSettings, api_client: Any = None) -> ReplicaDiscovery:
    """The discovery the settings chose; `api_client` (a kubernetes.client.ApiClient) overrides the
    in-cluster or kubeconfig configuration, for tests."""
    if settings.replica_discovery == "static":
        return StaticDiscovery(settings.replica_address_list())
    # Imported here: static runs (local, tests) never load the kubernetes client.
    from sluice.scheduler.discovery.endpoint_slices import EndpointSliceDiscovery, WatchTiming, kube_api_client

    return EndpointSliceDiscovery(
        api_client if api_client is not None else kube_api_client(),
        settings.kubernetes_namespace.strip(),
        settings.replica_service_list(),
        settings.replica_port_name.strip(),
        WatchTiming(resync_s=settings.replica_resync_s),
    )


async def serve(settings: SchedulerSettings, api_client: Any = None) -> None:
    metrics = SchedulerMetrics.create()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=metrics.registry)
    core = ClusterScheduler(settings.placement_config())
    servicer = SchedulerServicer(core, metrics)
    discovery = replica_discovery(settings, api_client)
    watcher = ReplicaWatcher(servicer.on_replica_state, servicer.on_replica_lost)
    metrics.replicas_ready.set_function(lambda: sum(view.ready for view in watcher.views()))
    server = HealthServer(
        [scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name],
        lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s),
    )
    discovery.start(watcher.set_addresses)
    port = await server.start(settings.scheduler_address)
    readiness = asyncio.create_task(_report_readiness(server, watcher))
    sweep = asyncio.create_task(servicer.sweep_forever(settings.schedule_interval_s))
    log.info("scheduler serving on port %d, replica discovery %s", port, settings.replica_discovery)
    freeze_startup_heap()
    await wait_for_stop_signal()
    log.info("stopping")
    readiness.cancel()
    sweep.cancel()
    await server.stop(settings.shutdown_grace_s)
    await discovery.stop()
    await watcher.stop()


async def _report_readiness(server: HealthServer, watcher: ReplicaWatcher, interval_s: float = 0.25) -> None:
    while True:
        await server.set_status(SCHEDULER_HAS_READY_REPLICA, any(view.ready for view in watcher.views()))
        await asyncio.sleep(interval_s)


def main() -> None:
    settings = SchedulerSettings()
    with service_telemetry("scheduler", settings.log_level, settings.log_format):
        asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
