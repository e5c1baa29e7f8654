"""`sluice top --once [--json]` end to end against a loopback page, both
as sluice.top.cli and through the `sluice` console script's delegation."""

import json

from sluice.devstack.stack import free_port
from sluice.ledger import cli as sluice_cli
from sluice.top import cli


def test_once_json_prints_the_view_model(server, capsys):
    down = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["--replica", server + "/metrics", "--scheduler", down, "--router", down, "--gateway", down,
                     "--interval-s", "0.05", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    replica = next(r for r in view["replicas"] if r["replica"] == "replica-0")
    assert (replica["kv_free_blocks"], replica["kv_used_blocks"], replica["kv_reserved_blocks"]) == (250, 750, None)
    assert replica["output_tokens_per_s"] == 0  # the page does not change between the two scrapes
    assert [t["up"] for t in view["targets"]] == [False, False, False, True]
    assert view["targets"][0]["url"] == down + "/metrics"


def test_sluice_top_is_delegated_by_the_sluice_console_script(server, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich's width off a terminal; 80 would truncate the replica table
    down = f"http://127.0.0.1:{free_port()}"
    assert sluice_cli.main(["top", "--once", "--interval-s", "0.05", "--replica", server, "--scheduler", down,
                            "--router", down, "--gateway", down]) == 0
    out = capsys.readouterr().out
    assert "replica-0" in out and "75.0%" in out and f"DOWN scheduler {down}/metrics" in out
