"""Liveness, readiness and metrics.

Two readiness questions, kept apart on purpose:
  /readyz        can this gateway serve? Its own stores only. Kubernetes
                 probes this: a gateway that left its Service while no
                 replica was ready would turn the clear 503 + Retry-After
                 its routes give into connection errors.
  /readyz/route  does a route to a ready replica exist? For tools that wait
                 for a whole stack (the local dev stack) and for people.
"""

import asyncio
import sqlite3

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sluice.gateway.resources import GatewayResources
from sluice.gateway.state import GatewayState

# A probe's own timeout is 3 s in the chart; answer before it gives up.
OUTBOX_CHECK_TIMEOUT_S = 2.0


async def healthz(request: Request) -> Response:
    """Liveness: the process answers. Also served as /health, which load
    tools such as guidellm probe before they start."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when what the gateway itself needs works or is in its designed
    fallback: the local outbox (every ledger row goes through it, so a
    database outage only makes it grow) answers, and the limits are in Redis
    or, while Redis is away, in this gateway's in-memory share. The router
    and replicas are not asked: without them requests get 503 with
    Retry-After, which only a ready gateway can send."""
    state: GatewayState = request.app.state.gateway
    try:
        pending = await asyncio.wait_for(asyncio.to_thread(state.resources.outbox.pending_count),
                                         OUTBOX_CHECK_TIMEOUT_S)
    except (TimeoutError, sqlite3.Error, OSError) as error:
        return JSONResponse({"status": "outbox unusable", "error": type(error).__name__}, status_code=503)
    return JSONResponse({"status": "ready", "outbox_pending": pending, "limits": limits_mode(state.resources)})


def limits_mode(resources: GatewayResources) -> str:
    """Where the token buckets live now: "redis", "fallback" (Redis away,
    this gateway's share in memory) or "process" (no Redis configured)."""
    if resources.redis is None:
        return "process"
    health = resources.limits_health
    return "fallback" if health is not None and health.down else "redis"


async def readyz_route(request: Request) -> Response:
    """A route to a replica exists: the router answers, its placement stream
    is open and the scheduler sees a ready replica."""
    state: GatewayState = request.app.state.gateway
    if await state.router.has_route():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "no route to a ready replica"}, status_code=503)


async def metrics(request: Request) -> Response:
    """The Prometheus text format, or OpenMetrics (which alone carries the
    trace-id exemplars of TTFT and ITL) when the scraper asks for it, as
    Prometheus does with exemplar storage on. Served here only when no
    separate metrics port is set (SLUICE_METRICS_PORT, see app.py)."""
    state: GatewayState = request.app.state.gateway
    if "application/openmetrics-text" in request.headers.get("accept", ""):
        return Response(openmetrics.generate_latest(state.metrics.registry),
                        headers={"Content-Type": openmetrics.CONTENT_TYPE_LATEST})
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
