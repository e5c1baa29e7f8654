"""`python -m sluice.tinymodel OUT_DIR [--seed N] [--layers N] [--force]`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sluice.tinymodel.build import build_tiny_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.tinymodel", description=__doc__)
    parser.add_argument("out_dir", type=Path, help="directory to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="weight init seed (default 0)")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers (default 4); fewer builds a smaller model with the same tokenizer")
    parser.add_argument("--force", action="store_true", help="rebuild even if OUT_DIR/config.json exists")
    args = parser.parse_args(argv)

    if (args.out_dir / "config.json").exists() and not args.force:
        print(f"{args.out_dir} already holds a checkpoint; use --force to rebuild", file=sys.stderr)
        return 0
    started_s = time.monotonic()
    build_tiny_checkpoint(args.out_dir, seed=args.seed, num_layers=args.layers)
    print(f"built {args.out_dir} in {time.monotonic() - started_s:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
