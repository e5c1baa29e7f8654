"""The devstack's two-version catalog: what it writes for the router, how
LocalStack wires one replica per version, and live weight rewrites.
Nothing is started; the file is read back by the router's own parser."""

import json
from pathlib import Path

import pytest

from sluice.devstack.catalog import CatalogVersion, LocalCatalog, set_weights, two_versions
from sluice.devstack.stack import LocalStack, StackPorts
from sluice.devstack.weights import main as weights_main
from sluice.router.catalog import load_catalog

BIG, SMALL = Path("/models/tiny-llama"), Path("/models/tiny-llama-small")


def make_stack(tmp_path: Path, num_replicas: int = 2, **kwargs) -> LocalStack:
    return LocalStack(model_dir=BIG, log_dir=tmp_path / "logs", num_replicas=num_replicas,
                      ports=StackPorts.ephemeral(num_replicas), catalog=two_versions(BIG, SMALL, (90, 10)), **kwargs)


def test_the_written_catalog_is_the_routers_format(tmp_path):
    path = tmp_path / "catalog.json"
    two_versions(BIG, SMALL, (90, 10)).write(path)
    (alias,) = load_catalog(path)
    assert alias.name == "tiny-llama"
    assert [(v.version, v.path, v.weight) for v in alias.versions] == [
        ("tiny-llama-v1", BIG, 90), ("tiny-llama-v2", SMALL, 10)]
    assert [p.name for p in tmp_path.iterdir()] == ["catalog.json"]  # no temporary left beside it


def test_each_replica_serves_its_version_and_the_router_reads_the_file(tmp_path):
    stack = make_stack(tmp_path, num_replicas=3, replica_env={2: {"SLUICE_MAX_NUM_SEQS": "4"}})
    envs = [stack.environment("replica", i) for i in range(3)]
    assert [e["SLUICE_MODEL_VERSION"] for e in envs] == ["tiny-llama-v1", "tiny-llama-v2", "tiny-llama-v1"]
    assert [e["SLUICE_MODEL_DIR"] for e in envs] == [str(BIG), str(SMALL), str(BIG)]
    assert envs[2]["SLUICE_MAX_NUM_SEQS"] == "4"
    assert stack.environment("router")["SLUICE_MODELS_FILE"] == str(tmp_path / "logs" / "models.json")
    assert "SLUICE_MODELS_FILE" not in stack.environment("gateway")


def test_without_a_catalog_nothing_changes(tmp_path):
    stack = LocalStack(model_dir=BIG, log_dir=tmp_path)
    assert "SLUICE_MODELS_FILE" not in stack.environment("router")
    assert "SLUICE_MODEL_VERSION" not in stack.environment("replica")
    assert stack.replica_version(0) is None


def test_fewer_replicas_than_versions_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs as many replicas"):
        make_stack(tmp_path, num_replicas=1)


def test_write_catalog_rewrites_weights_but_not_versions_nobody_serves(tmp_path):
    stack = make_stack(tmp_path, catalog_path=tmp_path / "c.json")
    stack.write_catalog(stack.catalog.with_weights(0, 100))
    assert [v.weight for v in load_catalog(tmp_path / "c.json")[0].versions] == [0, 100]
    with pytest.raises(ValueError, match="no replica"):
        stack.write_catalog(LocalCatalog("tiny-llama", (CatalogVersion("tiny-llama-v3", SMALL),)))


def test_bad_weights_are_refused():
    with pytest.raises(ValueError):
        two_versions(BIG, SMALL, (0, 0))
    with pytest.raises(ValueError):
        two_versions(BIG, SMALL).with_weights(1, 2, 3)


def test_set_weights_changes_only_the_named_versions_and_refuses_unknown_ones(tmp_path, capsys):
    path = tmp_path / "catalog.json"
    document = two_versions(BIG, SMALL, (90, 10)).document()
    document["models"][0]["routes"] = [{"to": "tiny-llama-v2", "max_prompt_tokens": 8}]
    path.write_text(json.dumps(document))
    assert weights_main([str(path), "tiny-llama-v1=0", "tiny-llama-v2=100"]) == 0
    written = json.loads(path.read_text())
    assert [v["weight"] for v in written["models"][0]["versions"]] == [0, 100]
    assert written["models"][0]["routes"] == document["models"][0]["routes"]
    before = path.read_text()
    assert weights_main([str(path), "tiny-llama-v9=5"]) == 1
    with pytest.raises(ValueError, match="all weights 0"):
        set_weights(path, {"tiny-llama-v2": 0})
    assert path.read_text() == before
