"""Generate the sluice.v1 Python stubs from protos/ into libs/rpc/src.

Generated code is committed (so installing a service needs no protoc); CI
regenerates into a temporary folder with `--check` and fails on any drift.

    python scripts/gen_protos.py            # rewrite libs/rpc/src/sluice/v1
    python scripts/gen_protos.py --check    # exit 1 if the committed stubs differ
"""

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "libs" / "rpc" / "src"
PACKAGE_DIR = Path("sluice") / "v1"


def generate(out_root: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    check = parser.parse_args().check
    if not check:
        generate(OUT_ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh, committed = Path(tmp) / PACKAGE_DIR, OUT_ROOT / PACKAGE_DIR
        names = sorted({p.name for p in fresh.glob("*_pb2*")} | {p.name for p in committed.glob("*_pb2*")})
        stale = [n for n in names if not (fresh / n).exists() or not (committed / n).exists()
                 or not filecmp.cmp(fresh / n, committed / n, shallow=False)]
    if stale:
        print("generated stubs are out of date, run `make protos`:", ", ".join(stale))
        return 1
    print("generated stubs match protos/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
