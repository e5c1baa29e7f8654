"""The gateway's HTTP server span comes from OpenTelemetry's ASGI
middleware only where tracing is on: with no SDK provider the middleware's
no-op span still cost a fifth of a refused request's CPU and a wrapper call
on every SSE chunk, so the app is built without it."""

from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

from sluice.gateway import app as gateway_app
from sluice.gateway.catch_all import CatchAll
from sluice.gateway.settings import GatewaySettings


def _middleware_classes(app) -> list[type]:
    return [entry.cls for entry in app.user_middleware]


def test_tracing_off_builds_the_app_without_the_otel_middleware(monkeypatch):
    monkeypatch.setattr(gateway_app, "tracing_installed", lambda: False)
    assert _middleware_classes(gateway_app.create_app(GatewaySettings())) == [CatchAll]


def test_tracing_on_puts_the_otel_middleware_outside_the_catch_all(monkeypatch):
    monkeypatch.setattr(gateway_app, "tracing_installed", lambda: True)
    # Outermost first: the server span covers the catch-all's 500 too.
    assert _middleware_classes(gateway_app.create_app(GatewaySettings())) == [OpenTelemetryMiddleware, CatchAll]
