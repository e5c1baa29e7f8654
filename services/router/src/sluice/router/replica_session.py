"""The router's side of Replica.GenerateMany: one call per replica, shared by
every request the router sends there (see sluice.rpc.multiplex_client).
A replica that goes away fails every request on it with `replica_lost`."""

from sluice.outcomes import Reason
from sluice.rpc.multiplex_client import MultiplexClient, MultiplexProtocol
from sluice.v1 import replica_pb2, replica_pb2_grpc


def replica_session(stub: replica_pb2_grpc.ReplicaStub) -> MultiplexClient[replica_pb2.TokenEvent]:
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
    )
