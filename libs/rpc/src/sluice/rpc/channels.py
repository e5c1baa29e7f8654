"""Client channels between services."""

import grpc

from sluice.rpc.server import MAX_MESSAGE_BYTES
from sluice.rpc.trace_interceptors import client_trace_interceptors

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Detect a dead peer on an idle long-lived stream (Place, WatchState)
    # within about a minute instead of waiting for TCP's timeout.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
)


def insecure_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=client_trace_interceptors())
