"""The one place where domain errors become gRPC statuses.

Servicers stay thin and raise `ServiceError`; this interceptor wraps every
handler (unary or streaming response) and aborts the call with the error's
status, message and trailing metadata. Anything else escapes as INTERNAL,
which grpc does by itself.
"""

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from sluice.rpc.errors import ServiceError


async def _abort(context: grpc.aio.ServicerContext, error: ServiceError) -> None:
    context.set_trailing_metadata(error.trailing_metadata())
    await context.abort(error.info.status, error.info.message)


def _wrap_stream(behaviour: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            result = behaviour(request, context)
            if inspect.isasyncgen(result):
                async for item in result:
                    yield item
            else:
                await result
        except ServiceError as error:
            await _abort(context, error)

    return wrapped


def _wrap_unary(behaviour: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behaviour(request, context)
        except ServiceError as error:
            await _abort(context, error)

    return wrapped


class ServiceErrorInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(handler.unary_unary), **codec)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_wrap_stream(handler.unary_stream), **codec)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_wrap_unary(handler.stream_unary), **codec)
        return grpc.stream_stream_rpc_method_handler(_wrap_stream(handler.stream_stream), **codec)
