"""The gateway's ASGI application."""

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import anyio
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from prometheus_client import start_wsgi_server
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sluice.gateway.auth import KeyCache
from sluice.gateway.background import BackgroundTasks
from sluice.gateway.catch_all import CatchAll
from sluice.gateway.errors import ApiError
from sluice.gateway.front_door import FrontDoor
from sluice.gateway.http_edge import EdgeLimits
from sluice.gateway.metrics import GatewayMetrics
from sluice.gateway.openapi import openapi_document
from sluice.gateway.resources import GatewayResources
from sluice.gateway.router_client import RouterClient
from sluice.gateway.routes import generation, health, models, usage
from sluice.gateway.settings import GatewaySettings
from sluice.gateway.state import GatewayState
from sluice.gateway.tenant_backoff import TenantBackoff
from sluice.gateway.translate import StreamDeadline
from sluice.outcomes import Reason
from sluice.telemetry.tracing import tracing_installed


# Starlette's own refusals (no route, wrong method) in OpenAI's error shape
# with a reason code; any other status it raises keeps its own detail.
HTTP_EXCEPTION_REASONS = {404: Reason.NOT_FOUND, 405: Reason.METHOD_NOT_ALLOWED}


async def _http_error(request: Request, error: HTTPException) -> Response:
    reason = HTTP_EXCEPTION_REASONS.get(error.status_code)
    if reason is None:
        return ApiError(error.status_code, str(error.detail), None).response()
    message = (f"No such API path: {request.url.path}." if reason is Reason.NOT_FOUND
               else f"{request.method} is not allowed on {request.url.path}.")
    api_error = ApiError.of(reason, message)
    if error.headers:  # 405's Allow
        api_error = replace(api_error, headers=dict(error.headers))
    return api_error.response()


def create_app(settings: GatewaySettings, edge_limits: EdgeLimits | None = None,
               on_started: Callable[[], None] | None = None) -> Starlette:
    """`edge_limits`: the HTTP server's (http_edge.py), whose counts the
    metrics page shows. `on_started` runs once the lifespan has opened
    every resource, before the first request (the server process freezes
    its start-up heap there). With settings.metrics_port set, /metrics is served
    on that port alone (a thread, as the gRPC services do), not on the
    public HTTP port."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        resources = await GatewayResources.open(settings)
        keys = KeyCache(resources.keys, settings.key_refresh_interval_s, settings.dev_api_key, settings.dev_tenant)
        await keys.start()
        router = RouterClient(settings.router_address, max_undelivered_events=settings.stream_buffer_events)
        background = BackgroundTasks()
        metrics = GatewayMetrics.create(edge_limits.closes if edge_limits is not None else None,
                                        outbox_depth=resources.outbox.pending_count)
        health = resources.limits_health
        metrics.limits_fallback.set_function(lambda: float(health is not None and health.down))
        metrics_server = None
        if settings.metrics_port:
            metrics_server, _ = start_wsgi_server(settings.metrics_port, settings.metrics_host,
                                                  registry=metrics.registry)
        app.state.gateway = GatewayState(
            settings=settings,
            router=router,
            authenticator=keys,
            metrics=metrics,
            resources=resources,
            front_door=FrontDoor(resources, settings),
            background=background,
            backoff=TenantBackoff(),
            stream_deadline=StreamDeadline(settings.stream_deadline_interactive_s, settings.stream_deadline_batch_s,
                                           settings.stream_deadline_per_token_s),
        )
        # Streamed responses run in anyio task groups, whose asyncio backend
        # anyio imports at its first use: here, not in the first request
        # (measured ~40 ms of its latency), and before the heap is frozen.
        anyio.create_task_group()
        if on_started is not None:
            on_started()
        try:
            yield
        finally:
            await background.drain(timeout_s=settings.shutdown_grace_s)
            await keys.stop()
            await router.close()
            await resources.close()
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()

    document = openapi_document()
    routes = [
        Route("/v1/chat/completions", generation.chat_completions, methods=["POST"]),
        Route("/v1/completions", generation.completions, methods=["POST"]),
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", models.retrieve_model, methods=["GET"]),
        Route("/v1/usage", usage.usage, methods=["GET"]),
        Route("/healthz", health.healthz, methods=["GET"]),
        Route("/health", health.healthz, methods=["GET"]),
        Route("/readyz", health.readyz, methods=["GET"]),
        Route("/readyz/route", health.readyz_route, methods=["GET"]),
        Route("/openapi.json", lambda request: JSONResponse(document), methods=["GET"]),
    ]
    if not settings.metrics_port:
        routes.append(Route("/metrics", health.metrics, methods=["GET"]))
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error},
                     middleware=[*_tracing_middleware(), Middleware(CatchAll)])


# Probes and scrapes every few seconds would drown the traces.
UNTRACED_PATHS = "/metrics$,/health$,/healthz$,/readyz$,/readyz/route$"


def _tracing_middleware() -> list[Middleware]:
    """The HTTP server span of every request, when tracing is on (the
    process installed an SDK provider before building the app). Its
    per-message "http send" spans are left out: an SSE stream would get one
    per chunk. With tracing off there is no middleware at all: its no-op
    span still cost a fifth of a refused request's CPU and a wrapper call
    on every SSE chunk; the gateway's own spans are then no-ops too."""
    if not tracing_installed():
        return []
    return [Middleware(OpenTelemetryMiddleware, excluded_urls=UNTRACED_PATHS, exclude_spans=["receive", "send"])]
