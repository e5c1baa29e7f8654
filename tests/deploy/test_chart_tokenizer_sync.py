"""The router's tokenizer files in Kubernetes: an init container and a
`tokenizer-sync` sidecar run files/copy-tokenizers.py, which reads the
catalog the router reads and copies each version's tokenizer files (never
its weights) to where the router container sees them. So a store-based
version added to the catalog reaches a running router without a roll.

The chart half renders with the real Helm SDK; the script half runs the
real script on temp directories and the tiny checkpoint (the layout the
pod gives it, with plain directories for the volumes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import (  # noqa: E402
    CHART_DIR,
    containers,
    example_values,
    of_kind,
    pod_spec,
    render_objects,
    the_deployment,
    volumes_by_name,
    with_version_volume,
)

COPY_TOKENIZERS = CHART_DIR / "files" / "copy-tokenizers.py"
WAIT_S = 30.0  # bound on waiting for the watching script; it normally takes well under a second


def router_pod(objects: list[dict]) -> dict:
    return pod_spec(the_deployment(objects, "router"))


def container_named(pod: dict, name: str) -> dict:
    (container,) = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name]
    return container


def maps_of(args: list[str]) -> list[tuple[str, str, str]]:
    return [tuple(args[i + 1:i + 4]) for i, arg in enumerate(args) if arg == "--map"]


def catalog_paths(objects: list[dict]) -> list[str]:
    (config_map,) = [c for c in of_kind(objects, "ConfigMap") if "models.json" in c["data"]]
    return sorted(v["path"] for m in json.loads(config_map["data"]["models.json"])["models"] for v in m["versions"])


def store_version(name: str) -> dict:
    return {"version": name, "alias": "llama-3.1-8b-instruct", "modelPath": f"llama-3.1-8b-instruct/{name}",
            "weight": 0, "replicas": 1}


# ---- the chart ------------------------------------------------------------------------


@pytest.mark.parametrize("values_factory", [example_values, with_version_volume], ids=["example", "own-volume"])
def test_the_copies_land_where_the_catalog_says_and_only_the_copiers_mount_weights(values_factory) -> None:
    objects = render_objects(values_factory())
    pod = router_pod(objects)
    router, init, sidecar = (container_named(pod, n) for n in ("router", "copy-tokenizers", "tokenizer-sync"))
    volumes = volumes_by_name(the_deployment(objects, "router"))
    model_volumes = {name for name, v in volumes.items() if "emptyDir" not in v and "configMap" not in v}
    assert model_volumes
    assert {m["name"] for m in router["volumeMounts"]}.isdisjoint(model_volumes)  # the router: no weights
    for copier in (init, sidecar):
        assert {m["name"] for m in copier["volumeMounts"] if m.get("readOnly")} == model_volumes | {"catalog"}
        (catalog_mount,) = [m for m in copier["volumeMounts"] if m["name"] == "catalog"]
        assert catalog_mount == next(m for m in router["volumeMounts"] if m["name"] == "catalog")  # what it reads
    assert "emptyDir" in volumes["tokenizers"]
    # Follow each catalog path through the --map args to its copy, and the
    # copy through the router's subPath mounts back to the catalog path.
    router_views = [m for m in router["volumeMounts"] if m["name"] == "tokenizers"]
    source_mounts = [m["mountPath"] for m in init["volumeMounts"] if m["name"] in model_volumes]
    for path in catalog_paths(objects):
        (prefix, source, target) = max((m for m in maps_of(init["args"]) if path.startswith(m[0] + "/")),
                                       key=lambda m: len(m[0]))
        rest = path.removeprefix(prefix)
        assert any((source + rest).startswith(mount + "/") for mount in source_mounts), path
        (view,) = [m for m in router_views if (target + rest).startswith(f"/tokenizers/{m['subPath']}/")]
        assert view["readOnly"] is True
        assert view["mountPath"] + (target + rest).removeprefix(f"/tokenizers/{view['subPath']}") == path


def test_the_sidecar_runs_the_init_containers_copy_with_a_watch(production_objects) -> None:
    pod = router_pod(production_objects)
    init, sidecar = container_named(pod, "copy-tokenizers"), container_named(pod, "tokenizer-sync")
    assert sidecar["command"] == init["command"] and sidecar["volumeMounts"] == init["volumeMounts"]
    assert sidecar["image"] == init["image"] == container_named(pod, "router")["image"]
    extra = sidecar["args"][len(init["args"]):]
    assert sidecar["args"][:len(init["args"])] == init["args"] and "--watch" not in init["args"]
    chart_default = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["router"]["tokenizerCopy"]
    assert extra[:2] == ["--watch", str(chart_default["watchSeconds"])]
    heartbeat = extra[extra.index("--heartbeat") + 1]
    assert heartbeat.startswith("/tokenizers/")
    router_views = [m["subPath"] for m in container_named(pod, "router")["volumeMounts"] if m["name"] == "tokenizers"]
    assert not any(heartbeat.startswith(f"/tokenizers/{view}/") for view in router_views)  # the router never sees it


def test_adding_a_store_based_version_leaves_the_router_pod_template_alone() -> None:
    values = example_values()
    before = render_objects(values)
    values["modelVersions"].append(store_version("llama-3.1-8b-instruct-v3"))
    after = render_objects(values)
    assert the_deployment(after, "router") == the_deployment(before, "router")  # no roll
    assert catalog_paths(after) == sorted([*catalog_paths(before), "/models/llama-3.1-8b-instruct/llama-3.1-8b-instruct-v3"])
    # rollOnCatalogChange still turns the same change into a roll.
    values["router"] = {"rollOnCatalogChange": True}
    rolled = the_deployment(render_objects(values), "router")["spec"]["template"]["metadata"]["annotations"]
    values["modelVersions"].append(store_version("llama-3.1-8b-instruct-v4"))
    rolled_again = the_deployment(render_objects(values), "router")["spec"]["template"]["metadata"]["annotations"]
    assert rolled["checksum/catalog"] != rolled_again["checksum/catalog"]


def test_a_version_with_its_own_volume_rolls_the_router_for_its_mount() -> None:
    def copier_mounts(pod: dict) -> set[str]:
        return {m["name"] for m in container_named(pod, "tokenizer-sync")["volumeMounts"]}

    before = router_pod(render_objects(example_values()))
    after = router_pod(render_objects(with_version_volume()))
    assert copier_mounts(after) - copier_mounts(before) == {"model-own-volume-v1"}  # as documented: a roll


def probe_result(probe: dict, heartbeat: Path) -> int:
    """Run an exec probe here, on a heartbeat file of our own."""
    command = [part.replace("/tokenizers/.copy-heartbeat", str(heartbeat)) for part in probe["exec"]["command"]]
    assert command[0] == "python"
    return subprocess.run([sys.executable, *command[1:]], timeout=30).returncode


def test_the_sidecars_probes_say_started_and_still_polling(production_objects, tmp_path) -> None:
    sidecar = container_named(router_pod(production_objects), "tokenizer-sync")
    assert "/tokenizers/.copy-heartbeat" in sidecar["args"]
    heartbeat = tmp_path / "heartbeat"
    assert probe_result(sidecar["readinessProbe"], heartbeat) != 0  # not started
    assert probe_result(sidecar["livenessProbe"], heartbeat) != 0
    heartbeat.touch()
    assert probe_result(sidecar["readinessProbe"], heartbeat) == 0
    assert probe_result(sidecar["livenessProbe"], heartbeat) == 0
    stale_s = time.time() - 3600
    os.utime(heartbeat, (stale_s, stale_s))  # passes stopped an hour ago
    assert probe_result(sidecar["livenessProbe"], heartbeat) != 0  # restart the sidecar ...
    assert probe_result(sidecar["readinessProbe"], heartbeat) == 0  # ... but keep the router in its Service


@pytest.fixture(scope="module")
def production_objects() -> list[dict]:
    return render_objects(example_values())


# ---- the script -------------------------------------------------------------------------


def checkpoint(tiny_model_dir: Path, at: Path) -> Path:
    """A checkpoint directory on the 'model volume': the tiny model's files, weights too."""
    shutil.copytree(tiny_model_dir, at)
    return at


def arrive(tiny_model_dir: Path, at: Path) -> None:
    """A checkpoint that appears whole (staged beside, then renamed in)."""
    staged = checkpoint(tiny_model_dir, at.with_name(f".{at.name}.upload"))
    staged.rename(at)


def write_catalog(path: Path, model_paths: list[str]) -> None:
    versions = [{"version": f"v{i}", "path": p, "weight": 1} for i, p in enumerate(model_paths)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"models": [{"name": "m", "versions": versions}]}))
    tmp.replace(path)  # as the kubelet swaps a ConfigMap: all at once


@pytest.fixture
def layout(tmp_path):
    """The pod's view: catalog paths under /models, the volume at source, copies to target."""
    source, target, catalog = tmp_path / "source" / "store", tmp_path / "tokenizers" / "store", tmp_path / "models.json"
    source.mkdir(parents=True)
    args = ["--catalog", str(catalog), "--map", "/models", str(source), str(target)]
    return source, target, catalog, args


def run_once(args: list[str], prelude: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", prelude + COPY_TOKENIZERS.read_text(), *args],
                          capture_output=True, text=True, timeout=60)


def test_once_copies_what_the_router_loads_and_no_weights(layout, tiny_model_dir) -> None:
    from sluice.router.models import TOKENIZER_FILES, tokenizer_digest
    from sluice.tokenization.tokenizer import Tokenizer

    source, target, catalog, args = layout
    checkpoint(tiny_model_dir, source / "tiny" / "v1")
    write_catalog(catalog, ["/models/tiny/v1"])
    result = run_once(args)
    assert result.returncode == 0, result.stderr
    copy = target / "tiny" / "v1"
    copied = {p.name for p in copy.iterdir()}
    assert not any(name.endswith((".safetensors", ".bin", ".pt", ".partial")) for name in copied)
    assert {name for name in TOKENIZER_FILES if (tiny_model_dir / name).is_file()} <= copied
    assert tokenizer_digest(copy) == tokenizer_digest(tiny_model_dir)
    assert Tokenizer.from_pretrained(copy).encode("hello") == Tokenizer.from_pretrained(tiny_model_dir).encode("hello")


def test_once_fails_naming_each_version_it_cannot_copy_and_copies_the_rest(layout, tiny_model_dir) -> None:
    source, target, catalog, args = layout
    checkpoint(tiny_model_dir, source / "ok")
    (source / "no-tokenizer").mkdir()
    (source / "no-tokenizer" / "config.json").write_text("{}")
    write_catalog(catalog, ["/models/ok", "/models/no-tokenizer", "/models/absent", "/elsewhere/x"])
    result = run_once(args)
    assert result.returncode == 1
    assert "has no tokenizer.json" in result.stderr
    assert "/models/absent" in result.stderr and "/elsewhere/x is on no mounted model volume" in result.stderr
    assert (target / "ok" / "tokenizer.json").is_file()
    assert not (target / "no-tokenizer" / "tokenizer.json").exists()


def test_each_file_is_renamed_into_place_and_tokenizer_json_last(layout, tiny_model_dir) -> None:
    source, target, catalog, args = layout
    checkpoint(tiny_model_dir, source / "v1")
    write_catalog(catalog, ["/models/v1"])
    # Record every rename the script makes (the real os.replace still runs).
    prelude = ("import os, sys\n_replace = os.replace\n"
               "def _recording(a, b):\n    print('replace', a, b, file=sys.stderr)\n    _replace(a, b)\n"
               "os.replace = _recording\n")
    result = run_once(args, prelude)
    assert result.returncode == 0, result.stderr
    renames = [line.split()[1:] for line in result.stderr.splitlines() if line.startswith("replace ")]
    finals = [Path(b).name for _, b in renames]
    assert finals[-1] == "tokenizer.json"  # the router loads nothing before it
    assert all(Path(a).parent == Path(b).parent and Path(a).name.endswith(".partial") for a, b in renames)
    assert sorted(finals) == sorted(p.name for p in (target / "v1").iterdir())  # nothing written in place


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


def test_watch_follows_the_catalog_and_retries_a_checkpoint_until_it_arrives(layout, tiny_model_dir, tmp_path) -> None:
    source, target, catalog, args = layout
    checkpoint(tiny_model_dir, source / "v1")
    write_catalog(catalog, ["/models/v1"])
    heartbeat = tmp_path / "heartbeat"
    log_path = tmp_path / "sync.log"
    with log_path.open("w") as log, subprocess.Popen(
            [sys.executable, "-c", COPY_TOKENIZERS.read_text(), *args, "--watch", "0.05", "--heartbeat", str(heartbeat)],
            stdout=log, stderr=subprocess.STDOUT) as process:
        try:
            wait_for(lambda: (target / "v1" / "tokenizer.json").is_file(), "the initial copy")
            assert heartbeat.exists()
            # A version added to the catalog whose checkpoint is not there yet: logged, retried.
            write_catalog(catalog, ["/models/v1", "/models/v2"])
            wait_for(lambda: "/models/v2" in log_path.read_text(), "the missing checkpoint logged")
            beat = heartbeat.stat().st_mtime_ns
            wait_for(lambda: heartbeat.stat().st_mtime_ns > beat, "another pass")
            arrive(tiny_model_dir, source / "v2")  # the upload finishes
            wait_for(lambda: (target / "v2" / "tokenizer.json").is_file(), "the late checkpoint copied")
            # A broken catalog (a bad edit) keeps the copies and the loop.
            catalog.write_text("{not json")
            wait_for(lambda: "cannot read the catalog" in log_path.read_text(), "the bad catalog logged")
            write_catalog(catalog, ["/models/v1", "/models/v2", "/models/v3"])
            arrive(tiny_model_dir, source / "v3")
            wait_for(lambda: (target / "v3" / "tokenizer.json").is_file(), "a third version copied")
            assert process.poll() is None  # still watching
        finally:
            process.terminate()
    output = log_path.read_text()
    assert output.count("/models/v2: ") == 1  # the missing checkpoint, once over many polls
    assert output.count("cannot read the catalog") == 1
    copied = [line for line in output.splitlines() if " -> " in line]
    assert [Path(line.split(" -> ")[0]).name for line in copied] == ["v1", "v2", "v3"]  # each copied once
    assert (target / "v1" / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()


def test_watch_refuses_a_poll_interval_that_is_not_positive(layout) -> None:
    _, _, catalog, args = layout
    write_catalog(catalog, [])
    result = run_once([*args, "--watch", "0"])
    assert result.returncode == 2 and "--watch must be > 0" in result.stderr
