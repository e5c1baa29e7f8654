import json
import logging

import pytest

from sluice.telemetry import process


class _Provider:
    shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


def test_the_block_runs_with_the_format_asked_for_and_tracing_is_flushed_when_it_fails(monkeypatch, capsys):
    provider = _Provider()
    names = []
    monkeypatch.setattr(process, "configure_tracing", lambda name: names.append(name) or provider)
    with pytest.raises(RuntimeError):
        with process.service_telemetry("router", "INFO", "json"):
            logging.getLogger("sluice.router").info("up")
            raise RuntimeError("serve failed")
    assert names == ["sluice-router"]
    assert provider.shut_down
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (line["service"], line["message"]) == ("router", "up")



def test_the_start_up_heap_is_frozen_out_of_later_full_collections():
    import gc

    start_up_objects = [{"long": "lived"} for _ in range(1000)]  # tracked, alive as long as the test
    gc.unfreeze()
    try:
        process.freeze_startup_heap()
        frozen = gc.get_freeze_count()
        assert frozen >= len(start_up_objects)
        assert not any(o is start_up_objects for o in gc.get_objects(2))  # no full collection walks them
    finally:
        gc.unfreeze()  # the test process keeps collecting as before
