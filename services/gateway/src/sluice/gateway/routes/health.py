"""Liveness, readiness and metrics."""

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sluice.gateway.state import GatewayState


async def healthz(request: Request) -> Response:
    """Liveness: the process answers. Also served as /health, which load
    tools such as guidellm probe before they start."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready only when a route to a replica exists: the router answers, its
    placement stream is open and the scheduler sees a ready replica."""
    state: GatewayState = request.app.state.gateway
    if await state.router.has_route():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "no route to a ready replica"}, status_code=503)


async def metrics(request: Request) -> Response:
    """The Prometheus text format, or OpenMetrics (which alone carries the
    trace-id exemplars of TTFT and ITL) when the scraper asks for it, as
    Prometheus does with exemplar storage on."""
    state: GatewayState = request.app.state.gateway
    if "application/openmetrics-text" in request.headers.get("accept", ""):
        return Response(openmetrics.generate_latest(state.metrics.registry),
                        headers={"Content-Type": openmetrics.CONTENT_TYPE_LATEST})
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
