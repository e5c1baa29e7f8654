"""The router's side of Replica.GenerateMany: one call per replica, shared by
every request the router sends there (see sluice.rpc.multiplex_client).
A replica that goes away fails every request on it with `replica_lost`; a
relay that falls `max_undelivered_events` behind its replica's events is
cancelled there and ends with `slow_reader`."""

from sluice.outcomes import Reason
from sluice.rpc.multiplex_client import DEFAULT_MAX_UNDELIVERED_EVENTS, MultiplexClient, MultiplexProtocol
from sluice.v1 import replica_pb2, replica_pb2_grpc


def replica_session(
    stub: replica_pb2_grpc.ReplicaStub, max_undelivered_events: int = DEFAULT_MAX_UNDELIVERED_EVENTS
) -> MultiplexClient[replica_pb2.TokenEvent]:
    return MultiplexClient(
        MultiplexProtocol(
            open_call=stub.GenerateMany,
            command=replica_pb2.GenerateCommand,
            submit_field="submit",
            event_field="token",
            is_last=lambda event: event.WhichOneof("event") == "finished",
        ),
        lost=Reason.REPLICA_LOST,
        name="replica-session",
        max_undelivered_events=max_undelivered_events,
    )
