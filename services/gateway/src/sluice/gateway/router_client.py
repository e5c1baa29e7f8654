"""The gateway's only upstream: the router.

Generation goes over one Router.GenerateMany call per gateway process
(sluice.rpc.multiplex_client): the router batches every stream's events
into one message per replica step, which is most of what makes relaying
tokens cheap. A router that cannot be reached, or goes away mid-stream,
fails its requests with `router_unavailable` (503, retryable). A stream
whose SSE client stops reading ends with `slow_reader` once
SLUICE_STREAM_BUFFER_EVENTS of its events wait unsent, and is cancelled
at the router, which frees the replica's KV.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.outcomes import Reason
from sluice.rpc.channels import insecure_channel
from sluice.rpc.health_names import ROUTER_HAS_ROUTE
from sluice.rpc.errors import ServiceError, from_rpc_error
from sluice.rpc.multiplex_client import DEFAULT_MAX_UNDELIVERED_EVENTS, MultiplexClient, MultiplexProtocol
from sluice.v1 import router_pb2, router_pb2_grpc


@dataclass(frozen=True, slots=True)
class OpenedStream:
    """A request whose first event has arrived (so it was admitted).

    Iterating ``rest`` raises ServiceError if the router or the call fails;
    ``cancel`` stops the request upstream (a no-op once it ended)."""

    first_event: router_pb2.GenerateEvent
    rest: AsyncIterator[router_pb2.GenerateEvent]
    cancel: Callable[[], None]


def _is_last(event: router_pb2.GenerateEvent) -> bool:
    return event.WhichOneof("event") in ("finished", "error")


class RouterClient:
    def __init__(self, address: str, *, max_undelivered_events: int = DEFAULT_MAX_UNDELIVERED_EVENTS) -> None:
        """`max_undelivered_events`: how far one stream's reader may fall
        behind before its request is cancelled (SLUICE_STREAM_BUFFER_EVENTS)."""
        self._channel = insecure_channel(address)
        self._stub = router_pb2_grpc.RouterStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._generation = MultiplexClient(
            MultiplexProtocol(
                open_call=self._stub.GenerateMany,
                command=router_pb2.RouterCommand,
                submit_field="generate",
                event_field="event",
                is_last=_is_last,
            ),
            lost=Reason.ROUTER_UNAVAILABLE,
            name="router-session",
            max_undelivered_events=max_undelivered_events,
        )

    async def open_stream(self, request: router_pb2.GenerateRequest) -> OpenedStream:
        """Send the request and wait for its first event; a refusal raises
        ServiceError before any byte is sent to the client."""
        events = self._generation.open(request)
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            raise ServiceError.of(Reason.INTERNAL_ERROR, "router ended the stream at once") from None
        except BaseException:
            events.cancel()
            raise
        return OpenedStream(first, events, events.cancel)

    async def list_models(self) -> router_pb2.ListModelsResponse:
        try:
            return await self._stub.ListModels(router_pb2.ListModelsRequest(), timeout=5.0)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error, unreachable=Reason.ROUTER_UNAVAILABLE) from None

    async def has_route(self) -> bool:
        """The router is up, placing, and the scheduler has a ready replica."""
        try:
            reply = await self._health.Check(health_pb2.HealthCheckRequest(service=ROUTER_HAS_ROUTE), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def close(self) -> None:
        await self._generation.close()
        await self._channel.close()
