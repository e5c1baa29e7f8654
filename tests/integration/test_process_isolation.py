"""The running control-plane processes have no torch loaded; the replica has."""

import pytest

pytestmark = pytest.mark.stack


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return any("libtorch" in line for line in maps)


def test_only_the_replica_process_loads_torch(stack):
    loaded = {name: _maps_torch(process.pid) for name, process in stack.processes.items()}
    assert loaded == {"gateway": False, "router": False, "scheduler": False, "replica": True}
