"""`python -m sglang_ext.bundle pack --out DIR [--cache DIR]`: write the bundle (two archives and serve_tiny.py) into
DIR; prints its size and what it carries. Exit status 2 with one line when it cannot."""

import argparse
import json
import sys
from pathlib import Path

from sglang_ext.env import ext_home


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_ext.bundle")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="build the offline bundle for a GPU machine with torch and Triton")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cache", type=Path, default=ext_home() / "bundle-cache",
                   help="where the cp312 wheels and the dependency archive are kept (default: "
                        "$SGLANG_EXT_HOME/bundle-cache)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    args = parser.parse_args(argv)
    from sglang_ext.bundle.pack import SIZE_LIMIT, BundleError, pack

    try:
        result = pack(args.out, args.cache)
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{args.out}: {result['total_bytes'] / 2**20:.1f} MiB in {len(result['files'])} files (limit "
              f"{SIZE_LIMIT >> 20} MiB); SGLang {result['sglang']}, {len(result['pure'])} pure-Python distributions, "
              f"{len(result['wheels'])} cp{result['python'].replace('.', '')} wheels")
        print(f"copy the folder to the GPU machine and run: python3 {args.out.name}/serve_tiny.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
