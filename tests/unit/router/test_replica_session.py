"""The router's replica session fails every request on a replica that goes
away with `replica_lost` (503, retryable), whether its call breaks or the
replica ends it with requests still running. A fake Replica (a grpc.aio
server on loopback) stands in for the engine, which needs torch."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from sluice.router.replica_session import replica_session
from sluice.rpc.errors import ServiceError
from sluice.v1 import replica_pb2, replica_pb2_grpc


class FakeReplica(replica_pb2_grpc.ReplicaServicer):
    """One token per submitted request; then hangs (`end=False`) or ends
    the call with the request unfinished (`end=True`)."""

    def __init__(self, end: bool) -> None:
        self.end = end

    async def GenerateMany(self, request_iterator, context):
        async for command in request_iterator:
            yield replica_pb2.TokenEventBatch(events=[replica_pb2.RequestEvent(
                request_id=command.submit.request_id, token=replica_pb2.TokenEvent(
                    tokens=replica_pb2.TokenDelta(token_ids=[7]))),
            ])
            if self.end:
                return
            await asyncio.Event().wait()


async def lose_the_replica(end: bool) -> ServiceError:
    server = grpc.aio.server()
    replica_pb2_grpc.add_ReplicaServicer_to_server(FakeReplica(end), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    session = replica_session(replica_pb2_grpc.ReplicaStub(channel))
    try:
        events = session.open(replica_pb2.TokenRequest(request_id="r1", prompt_token_ids=[1, 2]))
        first = await asyncio.wait_for(events.__anext__(), timeout=5)
        assert list(first.tokens.token_ids) == [7]
        if not end:
            await server.stop(0)  # the replica process dies mid-stream
        with pytest.raises(ServiceError) as lost:
            async for _ in events:
                pass
        return lost.value
    finally:
        await session.close()
        await channel.close()
        await server.stop(0)


@pytest.mark.parametrize("end", [False, True], ids=["call-breaks", "replica-ends-call"])
async def test_a_replica_that_goes_away_fails_its_requests_with_replica_lost(end):
    error = await lose_the_replica(end)
    assert (error.info.status, error.info.reason) == (grpc.StatusCode.UNAVAILABLE, "replica_lost")
    assert error.info.outcome.http_status == 503 and error.info.outcome.retryable
