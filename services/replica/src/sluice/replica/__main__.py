"""python -m sluice.replica"""

import asyncio
import logging
import sys
from pathlib import Path

import torch
from prometheus_client import start_http_server

from sluice.engine.block_manager import BlockManager
from sluice.engine.scheduler import IterationScheduler
from sluice.kernels import cpu_isa
from sluice.model.attention import default_backend, preferred_kv_layout
from sluice.model.cpu_tuning import tune_cpu_allocator
from sluice.model.kv_cache import allocate_kv_caches
from sluice.model.loader import load_llama
from sluice.model.runner import ModelRunner
from sluice.model.step_cost import attention_depth_scale_tokens
from sluice.replica.canary import Canary
from sluice.replica.capacity import kv_cache_blocks
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.engine_metrics import EngineMetrics
from sluice.replica.executor import StepExecutor
from sluice.replica.metrics import ReplicaCollector, ReplicaCounters, create_registry
from sluice.replica.servicer import ReplicaServicer
from sluice.replica.settings import ReplicaSettings
from sluice.rpc.server import HealthServer, wait_for_stop_signal
from sluice.v1 import replica_pb2, replica_pb2_grpc
from sluice.telemetry.process import freeze_startup_heap, service_telemetry

log = logging.getLogger("sluice.replica")


def build_engine(settings: ReplicaSettings, metrics: EngineMetrics) -> tuple[EngineLoop, ModelRunner]:
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    dtype = getattr(torch, settings.dtype)
    device = torch.device(settings.device)
    if device.type == "cpu":
        tune_cpu_allocator()  # keep per-step activation buffers in the heap (see cpu_tuning)
        cpu_isa.cap_isa(settings.cpu_isa)
        log.info("native CPU kernels: %s", cpu_isa.describe())
    model = load_llama(Path(settings.model_dir), dtype=dtype, device=device,
                       attention_backend=default_backend(device), cpu_linears=settings.cpu_linears,
                       probe_cache_dir=Path(settings.cpu_probe_cache_dir) if settings.cpu_probe_cache_dir else None)
    num_blocks = kv_cache_blocks(
        model.config, dtype, device, settings.block_size_tokens,
        settings.kv_cache_blocks, settings.kv_cache_bytes, settings.gpu_memory_fraction,
    )
    caches = allocate_kv_caches(model.config, num_blocks, settings.block_size_tokens, dtype, device,
                                layout=preferred_kv_layout(device, dtype))
    runner = ModelRunner(model, caches, single_thread_step_tokens=settings.for_device("single_thread_step_tokens"))
    core = IterationScheduler(
        settings.scheduler_config(max_model_len_tokens=model.config.max_position_embeddings,
                                  model_depth_scale_tokens=attention_depth_scale_tokens(model.config)),
        BlockManager(num_blocks, settings.block_size_tokens),
    )
    log.info("model %s on %s/%s, %d KV blocks of %d tokens", settings.model_dir, device, dtype, num_blocks,
             settings.block_size_tokens)
    return EngineLoop(core, StepExecutor(runner), metrics=metrics,
                      overlap=bool(settings.for_device("async_scheduling"))), runner


async def serve(settings: ReplicaSettings) -> None:
    engine_metrics = EngineMetrics(settings.model_version, settings.replica_id)
    engine, runner = build_engine(settings, engine_metrics)
    config = runner.model.config
    counters = ReplicaCounters()
    server: HealthServer | None = None

    async def on_readiness(ready: bool) -> None:
        if server is not None:
            await server.set_serving(ready)

    canary = Canary(
        engine,
        probe_token_id=config.bos_token_id if config.bos_token_id is not None else 0,
        interval_s=settings.canary_interval_s,
        timeout_s=settings.canary_timeout_s,
        on_change=on_readiness,
        counters=counters,
    )
    is_ready = lambda: canary.ready  # noqa: E731
    if settings.metrics_port:
        collector = ReplicaCollector(settings.replica_id, settings.model_version, lambda: engine.snapshot, counters,
                                     is_ready)
        start_http_server(settings.metrics_port, settings.metrics_host, registry=create_registry(collector, engine_metrics))
    servicer = ReplicaServicer(
        engine, config, settings.replica_id, settings.model_version, is_ready, counters, settings.state_interval_s
    )
    server = HealthServer(
        [replica_pb2.DESCRIPTOR.services_by_name["Replica"].full_name],
        lambda s: replica_pb2_grpc.add_ReplicaServicer_to_server(servicer, s),
    )
    engine.start()
    port = await server.start(settings.replica_address, serving=False)  # until the first canary passes
    canary_task = asyncio.create_task(canary.run())
    freeze_startup_heap()
    log.info("replica %s serving %s on port %d", settings.replica_id, settings.model_version, port)
    await wait_for_stop_signal()
    log.info("stopping")
    servicer.close_watches()
    await server.stop(settings.shutdown_grace_s)
    canary_task.cancel()
    engine.stop()


def main() -> None:
    settings = ReplicaSettings()
    sys.setswitchinterval(settings.gil_switch_interval_s)
    with service_telemetry("replica", settings.log_level, settings.log_format):
        asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
