"""SIGTERM -> NOT_SERVING -> stop(grace): probes see NOT_SERVING at once,
in-flight streams finish within the grace period."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.devstack.stack import free_port
from sluice.rpc.server import HealthServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _slow_stream(request: bytes, context):
    for i in range(5):
        await asyncio.sleep(0.1)
        yield bytes([i])


def _register(server: grpc.aio.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        "test.Slow",
        {"Stream": grpc.unary_stream_rpc_method_handler(_slow_stream, lambda b: b, lambda b: b)},
    )
    server.add_generic_rpc_handlers((handler,))


async def test_shutdown_turns_health_not_serving_and_lets_streams_finish():
    server = HealthServer(["test.Slow"], _register)
    port = await server.start("127.0.0.1:0")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="test.Slow"))
        assert (await watch.read()).status == SERVING
        stream = channel.unary_stream("/test.Slow/Stream", lambda b: b, lambda b: b)(b"")
        first = await stream.read()
        stopping = asyncio.create_task(server.stop(grace_s=5.0))
        assert (await watch.read()).status == NOT_SERVING
        rest = []
        while (message := await stream.read()) is not grpc.aio.EOF:
            rest.append(message)
        assert [first, *rest] == [bytes([i]) for i in range(5)]
        await stopping


async def test_set_serving_false_is_visible_to_probes():
    server = HealthServer(["test.Slow"], _register)
    port = await server.start("127.0.0.1:0", serving=False)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert (await health.Check(health_pb2.HealthCheckRequest(service=""))).status == NOT_SERVING
        await server.set_serving(True)
        assert (await health.Check(health_pb2.HealthCheckRequest(service="test.Slow"))).status == SERVING
    await server.stop(0)


def test_scheduler_process_exits_cleanly_on_sigterm(tmp_path):
    port = free_port()
    env = {**os.environ, "SLUICE_SCHEDULER_ADDRESS": f"127.0.0.1:{port}", "SLUICE_REPLICA_ADDRESSES": ""}
    process = subprocess.Popen([sys.executable, "-m", "sluice.scheduler"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == SERVING:
                        break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, "scheduler never became healthy"
                    time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert b"stopping" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
