"""python -m sluice.scheduler"""

import asyncio
import logging

from prometheus_client import start_http_server

from sluice.placement.cluster import ClusterScheduler
from sluice.rpc.health_names import SCHEDULER_HAS_READY_REPLICA
from sluice.rpc.server import HealthServer, wait_for_stop_signal
from sluice.scheduler.metrics import SchedulerMetrics
from sluice.scheduler.replica_watch import ReplicaWatcher
from sluice.scheduler.servicer import SchedulerServicer
from sluice.scheduler.settings import SchedulerSettings
from sluice.v1 import scheduler_pb2, scheduler_pb2_grpc
from sluice.telemetry.process import service_telemetry

log = logging.getLogger("sluice.scheduler")


async def serve(settings: SchedulerSettings) -> None:
    metrics = SchedulerMetrics.create()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, registry=metrics.registry)
    core = ClusterScheduler(settings.placement_config())
    servicer = SchedulerServicer(core, metrics)
    watcher = ReplicaWatcher(settings.replica_address_list(), servicer.on_replica_state, servicer.on_replica_lost)
    metrics.replicas_ready.set_function(lambda: sum(view.ready for view in watcher.views()))
    server = HealthServer(
        [scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name],
        lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s),
    )
    watcher.start()
    port = await server.start(settings.scheduler_address)
    readiness = asyncio.create_task(_report_readiness(server, watcher))
    sweep = asyncio.create_task(servicer.sweep_forever(settings.schedule_interval_s))
    log.info("scheduler serving on port %d, watching %s", port, settings.replica_address_list())
    await wait_for_stop_signal()
    log.info("stopping")
    readiness.cancel()
    sweep.cancel()
    await server.stop(settings.shutdown_grace_s)
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
