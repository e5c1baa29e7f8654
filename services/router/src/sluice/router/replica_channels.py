"""One gRPC channel per replica address, opened on first use, and on it the
router's one GenerateMany session per replica (see replica_session)."""

import grpc

from sluice.router.replica_session import replica_session
from sluice.rpc.multiplex_client import DEFAULT_MAX_UNDELIVERED_EVENTS, MultiplexClient
from sluice.rpc.channels import insecure_channel
from sluice.v1 import replica_pb2, replica_pb2_grpc


class ReplicaChannels:
    def __init__(self, max_undelivered_events: int = DEFAULT_MAX_UNDELIVERED_EVENTS) -> None:
        self._max_undelivered_events = max_undelivered_events
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._sessions: dict[str, MultiplexClient[replica_pb2.TokenEvent]] = {}

    def stub(self, address: str) -> replica_pb2_grpc.ReplicaStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = insecure_channel(address)
        return replica_pb2_grpc.ReplicaStub(channel)

    def session(self, address: str) -> MultiplexClient[replica_pb2.TokenEvent]:
        session = self._sessions.get(address)
        if session is None:
            session = self._sessions[address] = replica_session(self.stub(address), self._max_undelivered_events)
        return session

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
