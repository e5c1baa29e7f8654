"""The router's side of Replica.GenerateMany: one call per replica, shared by
every request the router sends there (see sluice.rpc.multiplex_client)."""

from collections.abc import Iterator

from sluice.rpc.multiplex_client import MultiplexClient, MultiplexProtocol
from sluice.v1 import common_pb2, replica_pb2, replica_pb2_grpc

ReplicaEvent = tuple[str, replica_pb2.TokenEvent | None, common_pb2.RequestFailed | None]


def _events(batch: replica_pb2.TokenEventBatch) -> Iterator[ReplicaEvent]:
    for event in batch.events:
        if event.WhichOneof("event") == "failed":
            yield event.request_id, None, event.failed
        else:
            yield event.request_id, event.token, None


def replica_session(stub: replica_pb2_grpc.ReplicaStub) -> MultiplexClient[replica_pb2.TokenEvent]:
    return MultiplexClient(
        MultiplexProtocol(
            open_call=stub.GenerateMany,
            request_id=lambda request: request.request_id,
            submit=lambda request: replica_pb2.GenerateCommand(submit=request),
            cancel=lambda request_id: replica_pb2.GenerateCommand(cancel_request_id=request_id),
            events=_events,
            is_last=lambda event: event.WhichOneof("event") == "finished",
        ),
        name="replica-session",
    )
