"""Router gRPC servicer: protobuf in, the relay does the work, protobuf out."""

from collections.abc import AsyncIterator

import grpc

from sluice.router.live_models import LiveModels
from sluice.router.multiplex import RoutedRequests
from sluice.router.relay import Relay
from sluice.rpc.multiplex_server import serve_multiplexed
from sluice.v1 import router_pb2, router_pb2_grpc


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, relay: Relay, models: LiveModels) -> None:
        self._relay = relay
        self._models = models

    async def Generate(
        self, request: router_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.GenerateEvent]:
        async for event in self._relay.generate(request):
            yield event

    async def GenerateMany(
        self, request_iterator: AsyncIterator[router_pb2.RouterCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.GenerateEventBatch]:
        async for batch in serve_multiplexed(request_iterator, RoutedRequests(self._relay)):
            yield batch

    async def ListModels(
        self, request: router_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.ListModelsResponse:
        registry = self._models.current  # the live catalog, as of this call
        models = []
        for name in sorted(registry.aliases):
            versions = registry.versions_of(name)
            models.append(
                router_pb2.ModelInfo(
                    id=name,
                    versions=[v.spec.version for v in versions],
                    context_length_tokens=min(v.context_length_tokens for v in versions),
                    created_unix_s=registry.alias_created_unix_s(name),
                )
            )
        return router_pb2.ListModelsResponse(models=models)
