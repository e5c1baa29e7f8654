"""One gRPC channel per replica address, opened on first use."""

from sluice.rpc.channels import insecure_channel
from sluice.v1 import replica_pb2_grpc

import grpc


class ReplicaChannels:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> replica_pb2_grpc.ReplicaStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = insecure_channel(address)
        return replica_pb2_grpc.ReplicaStub(channel)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
