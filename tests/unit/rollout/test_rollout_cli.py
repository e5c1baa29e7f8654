"""`sluice rollout` end to end on a catalog file, against a loopback server
in Prometheus's shapes (that it never imports torch: tests/unit/test_control_plane_torch_free.py)."""

import json
import subprocess
import sys
import time

import pytest
from rollout_support import FakePrometheus, vector

from sluice.ledger.cli import main as sluice_main
from sluice.rollout.cli import main
from sluice.rollout.local_store import LocalCatalogStore
from sluice.rollout.machine import Phase
from sluice.rollout.weights import alias_weights

FAST = ["--dwell-s", "0", "--min-requests", "5", "--poll-s", "0.01", "--min-window-s", "1", "--skip-quality"]


@pytest.fixture()
def catalog(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [{"name": "tiny-llama", "versions": [
        {"version": "tiny-llama-v1", "path": str(tmp_path / "v1"), "weight": 100},
        {"version": "tiny-llama-v2", "path": str(tmp_path / "v2"), "weight": 0}]}]}))
    return path


def healthy(query: str) -> tuple[int, dict]:
    if "increase(" in query:
        return 200, vector("50")
    if "outcome=\"error\"" in query:
        return 200, vector("0")
    return 200, vector("0.1")  # TTFT and ITL p99


def weights(path) -> tuple:
    return alias_weights(LocalCatalogStore(path).read_catalog(), "tiny-llama").weights


def test_start_walks_the_steps_and_exits_0_with_the_candidate_at_100(catalog, capsys):
    with FakePrometheus(healthy) as prometheus:
        code = main(["start", "--alias", "tiny-llama", "--candidate", "tiny-llama-v2", "--catalog", str(catalog),
                     "--steps", "10,50,100", "--prometheus", prometheus.url, *FAST])
    assert code == 0
    assert weights(catalog) == (("tiny-llama-v1", 0), ("tiny-llama-v2", 100))  # --serving found from the weights
    err = capsys.readouterr().err
    assert "10% of tiny-llama to tiny-llama-v2" in err and "50%" in err and "can be removed" in err
    assert main(["status", "--catalog", str(catalog)]) == 0
    assert "completed" in capsys.readouterr().out


def test_a_breached_gate_exits_1_rolled_back(catalog, capsys):
    with FakePrometheus(healthy) as prometheus:
        code = main(["start", "--alias", "tiny-llama", "--candidate", "tiny-llama-v2", "--catalog", str(catalog),
                     "--prometheus", prometheus.url, "--max-ttft-p99-s", "0.05", *FAST])
    assert code == 1
    assert weights(catalog) == (("tiny-llama-v1", 100), ("tiny-llama-v2", 0))
    assert "SLO breach at 1%: TTFT p99 0.1s is over the limit 0.05s" in capsys.readouterr().err


def test_pause_and_abort_from_a_second_invocation(catalog, capsys):
    quiet = lambda query: (200, vector("0"))  # noqa: E731 (no traffic: the rollout holds its first step)
    with FakePrometheus(quiet) as prometheus:
        # The controller in its own process, as an operator's terminal or a Job would run it.
        controller = subprocess.Popen(
            [sys.executable, "-m", "sluice.rollout", "start", "--alias", "tiny-llama", "--candidate", "tiny-llama-v2",
             "--catalog", str(catalog), "--prometheus", prometheus.url, *FAST],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            store = LocalCatalogStore(catalog)
            wait_for_phase(store, Phase.STEPPING, controller)
            assert main(["pause", "--catalog", str(catalog)]) == 0
            wait_for_phase(store, Phase.PAUSED, controller)
            assert weights(catalog) == (("tiny-llama-v1", 99), ("tiny-llama-v2", 1))  # held where it was
            assert main(["abort", "--catalog", str(catalog)]) == 0
            _, err = controller.communicate(timeout=30)
        finally:
            controller.kill()
    assert controller.returncode == 1, err
    assert "operator: pause" in err and "operator: abort" in err
    assert weights(catalog) == (("tiny-llama-v1", 100), ("tiny-llama-v2", 0))
    assert store.read_status().reason == "aborted by the operator"
    assert main(["resume", "--catalog", str(catalog)]) == 2  # nothing left to resume
    assert "nothing to resume: the last rollout rolled_back" in capsys.readouterr().err


def wait_for_phase(store: LocalCatalogStore, phase: Phase, controller: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while True:
        status = store.read_status()
        if status is not None and status.phase == phase:
            return
        assert controller.poll() is None, controller.stderr.read()
        assert time.monotonic() < deadline, f"the rollout never reached {phase}: {status}"
        time.sleep(0.02)


@pytest.mark.parametrize("extra, message", [
    (["--steps", "5,1,100"], "steps must increase"),
    (["--steps", "1,x"], "comma-separated whole percentages"),
    (["--candidate", "tiny-llama-v9"], "candidate version 'tiny-llama-v9'"),
    (["--alias", "nope"], "no alias 'nope'"),
    (["--max-error-rate", "2"], "max_error_rate must be within 0..1"),
    (["--prometheus", "prometheus:9090"], "must start with http://"),
])
def test_bad_input_exits_2_with_the_reason(catalog, capsys, extra, message):
    argv = ["start", "--alias", "tiny-llama", "--candidate", "tiny-llama-v2", "--catalog", str(catalog), *FAST]
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusal
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert weights(catalog) == (("tiny-llama-v1", 100), ("tiny-llama-v2", 0))


def test_a_config_file_sets_the_gates_and_refuses_unknown_keys(catalog, tmp_path, capsys):
    config = tmp_path / "rollout.json"
    config.write_text(json.dumps({"steps": [50, 100], "slo": {"maxTtftP99Secs": 1}}))
    argv = ["start", "--alias", "tiny-llama", "--candidate", "tiny-llama-v2", "--catalog", str(catalog),
            "--config", str(config), *FAST]
    assert main(argv) == 2
    assert "unknown keys in 'slo': maxTtftP99Secs" in capsys.readouterr().err
    config.write_text(json.dumps({"steps": [50, 100], "slo": {"maxItlP99Seconds": 0.01}}))
    with FakePrometheus(healthy) as prometheus:
        assert main([*argv, "--prometheus", prometheus.url]) == 1
    assert "SLO breach at 50%: ITL p99" in capsys.readouterr().err


def test_status_without_a_rollout_and_the_sluice_delegation(catalog, capsys):
    assert sluice_main(["rollout", "status", "--catalog", str(catalog)]) == 2
    assert "no rollout has run" in capsys.readouterr().err
