"""The gateway's only upstream: the router."""

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.rpc.channels import insecure_channel
from sluice.rpc.health_names import ROUTER_HAS_ROUTE
from sluice.rpc.errors import ServiceError, from_rpc_error
from sluice.v1 import router_pb2, router_pb2_grpc


@dataclass(frozen=True, slots=True)
class OpenedStream:
    """A Generate call whose first event has arrived (so it was admitted)."""

    call: grpc.aio.UnaryStreamCall
    first_event: router_pb2.GenerateEvent
    rest: AsyncIterator[router_pb2.GenerateEvent]


class RouterClient:
    def __init__(self, address: str) -> None:
        self._channel = insecure_channel(address)
        self._stub = router_pb2_grpc.RouterStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def open_stream(self, request: router_pb2.GenerateRequest) -> OpenedStream:
        """Start Generate and wait for its first event; a refusal raises
        ServiceError before any byte is sent to the client."""
        call = self._stub.Generate(request)
        events = call.__aiter__()
        try:
            first = await events.__anext__()
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        except StopAsyncIteration:
            raise ServiceError(grpc.StatusCode.INTERNAL, "internal_error", "router ended the stream at once") from None
        except BaseException:
            call.cancel()
            raise
        return OpenedStream(call, first, events)

    async def list_models(self) -> router_pb2.ListModelsResponse:
        try:
            return await self._stub.ListModels(router_pb2.ListModelsRequest(), timeout=5.0)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None

    async def has_route(self) -> bool:
        """The router is up, placing, and the scheduler has a ready replica."""
        try:
            reply = await self._health.Check(health_pb2.HealthCheckRequest(service=ROUTER_HAS_ROUTE), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def close(self) -> None:
        await self._channel.close()
