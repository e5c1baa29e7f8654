# The router's tokenizer copy (run with `python -c`, stdlib only): copy what
# the router reads of each catalog version's checkpoint (sluice.router.models,
# sluice.tokenization.tokenizer) from the model volume into an emptyDir, so
# the router container never mounts the weights.
#
# It reads the catalog the router reads (the ConfigMap directory mount) for
# the versions' paths, and maps each path as the router sees it to where the
# checkpoint is mounted here and where its copy goes:
#   --map /models /source/store /tokenizers/store
# sends /models/llama-8b to /source/store/llama-8b -> /tokenizers/store/llama-8b.
# Once (the init container): copy every version, exit 1 naming any that is
# missing. --watch SECONDS (the sidecar): keep following the catalog, so a
# version added to the ConfigMap reaches a running router; a checkpoint not
# there yet is logged once and tried again each poll.
#
# Each file is written under a temporary name and renamed, tokenizer.json
# last: the router loads nothing without tokenizer.json, so it never reads
# half a set (it retries a catalog whose files are missing). A version whose
# copy has tokenizer.json is done: a version's files never change under its
# name (a new model is a new version).
import argparse
import json
import os
import pathlib
import shutil
import sys
import time

FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.model",
         "chat_template.jinja", "tokenizer.json")  # tokenizer.json last: the mark of a whole copy
REQUIRED = ("tokenizer.json", "config.json")


def log(message):
    print(f"copy-tokenizers: {message}", file=sys.stderr, flush=True)


def catalog_paths(catalog):
    """Every version's checkpoint path in the catalog file, sorted."""
    models = json.loads(pathlib.Path(catalog).read_text()).get("models")
    if not isinstance(models, list):
        raise ValueError(f"{catalog} has no list of models")
    return sorted({str(version["path"]) for model in models for version in model.get("versions", [])})


def locate(path, maps):
    """(source, target) of a catalog path: the longest --map prefix that holds it, else None."""
    path = path.rstrip("/")
    for prefix, source, target in sorted(maps, key=lambda m: len(m[0]), reverse=True):
        prefix = prefix.rstrip("/")
        if path == prefix or path.startswith(prefix + "/"):
            rest = path[len(prefix):].lstrip("/")
            return pathlib.Path(source, rest), pathlib.Path(target, rest)
    return None


def copy_checkpoint(source, target):
    """The files the router reads, each written atomically, tokenizer.json last."""
    present = [name for name in FILES if (source / name).is_file()]
    missing = [name for name in REQUIRED if name not in present]
    if missing:
        raise FileNotFoundError(f"{source} has no {' or '.join(missing)}")
    target.mkdir(parents=True, exist_ok=True)
    for name in present:
        partial = target / f".{name}.partial"
        shutil.copyfile(source / name, partial)
        os.replace(partial, target / name)
    return present


def sync(catalog, maps, reported, heartbeat):
    """One pass over the catalog; returns what could not be copied. Each
    problem is logged once (reported) until it is solved or changes."""
    try:
        paths = catalog_paths(catalog)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return [report(reported, "catalog", f"cannot read the catalog {catalog}: {error!r}")]
    problems = []
    for path in paths:
        located = locate(path, maps)
        if located is None:
            problems.append(report(reported, path, f"{path} is on no mounted model volume (no --map holds it)"))
            continue
        source, target = located
        if (target / "tokenizer.json").is_file():
            reported.pop(path, None)
            continue
        try:
            present = copy_checkpoint(source, target)
        except OSError as error:
            problems.append(report(reported, path, f"{path}: {error}; the router cannot serve it until it is copied"))
            continue
        reported.pop(path, None)
        log(f"{source} -> {target}: {', '.join(present)}")
        if heartbeat:  # a slow volume may take long over many versions: still alive
            heartbeat.touch()
    return problems


def report(reported, key, message):
    if reported.get(key) != message:
        reported[key] = message
        log(message)
    return message


def main(argv):
    parser = argparse.ArgumentParser(prog="copy-tokenizers")
    parser.add_argument("--catalog", required=True, help="the router's models.json")
    parser.add_argument("--map", nargs=3, action="append", required=True, metavar=("PREFIX", "SOURCE", "TARGET"),
                        help="catalog paths under PREFIX are read from SOURCE and copied to TARGET")
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="keep polling the catalog")
    parser.add_argument("--heartbeat", type=pathlib.Path, help="touched after every pass (liveness)")
    args = parser.parse_args(argv)
    if args.watch is not None and args.watch <= 0:
        parser.error(f"--watch must be > 0 seconds, got {args.watch}")
    for _, _, target in args.map:
        pathlib.Path(target).mkdir(parents=True, exist_ok=True)  # the router mounts these as subPaths
    reported = {}
    if args.heartbeat:
        args.heartbeat.touch()  # a restarted sidecar is alive before its first pass ends
    while True:
        problems = sync(args.catalog, args.map, reported, args.heartbeat)
        if args.watch is None:
            return 1 if problems else 0
        if args.heartbeat:
            args.heartbeat.touch()
        time.sleep(args.watch)


sys.exit(main(sys.argv[1:]))
