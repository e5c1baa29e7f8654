"""Lifecycle of a Sluice gRPC server.

Every server serves grpc.health.v1 beside its own services and shuts down
as SIGTERM -> NOT_SERVING -> server.stop(grace): load balancers and probes
see NOT_SERVING first, in-flight streams get `grace_s` to finish, then the
rest are cancelled (which frees their KV on a replica).
"""

import asyncio
import signal
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from sluice.rpc.interceptors import ServiceErrorInterceptor
from sluice.rpc.trace_interceptors import server_trace_interceptor

# Bigger than gRPC's 4 MiB default: a 128K-token prompt is ~0.5 MiB of ids,
# but a chat with long messages as text can be several MiB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    # Clients ping idle long-lived streams (see channels.py); accept that.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
)


class HealthServer:
    """A grpc.aio server with the health service and the error interceptor.

    `service_names` are the fully qualified names reported by the health
    service (plus "" for the whole server). A service marks itself not
    serving with `set_serving(False)`, e.g. a replica whose canary failed.
    """

    def __init__(self, service_names: Sequence[str], register: Callable[[grpc.aio.Server], None]) -> None:
        self._service_names = ("", *service_names)
        self._health = HealthServicer()
        # The tracing interceptor outermost, so its span records the status
        # the error interceptor mapped.
        self._server = grpc.aio.server(
            interceptors=[server_trace_interceptor(), ServiceErrorInterceptor()], options=SERVER_OPTIONS,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        register(self._server)

    async def start(self, bind_address: str, *, serving: bool = True) -> int:
        """Bind and start; returns the port (useful with port 0 in tests)."""
        port = self._server.add_insecure_port(bind_address)
        if port == 0:
            raise OSError(f"could not bind gRPC server to {bind_address}")
        await self.set_serving(serving)
        await self._server.start()
        return port

    async def set_serving(self, serving: bool) -> None:
        for name in self._service_names:
            await self.set_status(name, serving)

    async def set_status(self, name: str, serving: bool) -> None:
        """Report one health name, e.g. a readiness condition beyond "the
        process answers" (see readiness names in sluice.rpc.health_names)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self._health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


async def wait_for_stop_signal() -> None:
    """Return on the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
