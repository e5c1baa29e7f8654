"""OpenTelemetry's gRPC interceptors, as every Sluice channel and server uses them.

A call that carries one request (Router.Generate, Replica.Generate,
ListModels) gets a client and a server span from the maintained
instrumentation, with the context in the call's metadata.

The long-lived calls are left out: a GenerateMany or Place call lives as
long as the connection and carries thousands of requests, so a span for it
would last hours, belong to whichever request happened to open it, and say
nothing about any request. Each request on them carries its own context in
its message's `trace_context` field instead (sluice.telemetry.carrier).
WatchState (a state feed) and the health service (probes every few
seconds) would only add noise.

With tracing off (no SDK provider installed) the interceptors start
non-recording spans, which cost a few attribute lookups per call.
"""

from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import any_of, health_check, method_name, negate

UNTRACED_METHODS = ("GenerateMany", "Place", "WatchState")

_TRACED = negate(any_of(health_check(), *(method_name(name) for name in UNTRACED_METHODS)))


def client_trace_interceptors() -> list:
    return list(aio_client_interceptors(filter_=_TRACED))


def server_trace_interceptor():
    return aio_server_interceptor(filter_=_TRACED)
