"""The gateway imports at start-up what its first streamed response would
otherwise import (anyio's asyncio backend, ~40 ms of that request's
latency). In a fresh interpreter: in this one, the test client has
imported it long ago."""

import subprocess
import sys
import textwrap


def test_the_lifespan_leaves_nothing_for_the_first_streamed_response_to_import(tmp_path):
    code = textwrap.dedent(f"""
        import asyncio, socket, sys
        from sluice.gateway.app import create_app
        from sluice.gateway.settings import GatewaySettings

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        settings = GatewaySettings(database_url="sqlite:///{tmp_path / 'ledger.db'}",
                                   outbox_path="{tmp_path / 'outbox.db'}",
                                   router_address=f"127.0.0.1:{{port}}", dev_api_key="sk-test")
        app = create_app(settings)
        BACKEND = "anyio._backends._asyncio"

        async def main():
            before = BACKEND in sys.modules
            async with app.router.lifespan_context(app):
                print(before, BACKEND in sys.modules)

        asyncio.run(main())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]
