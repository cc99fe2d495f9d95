"""`python -m sglang_ext.ple bench ...` (see bench.py)."""

import argparse
import sys

from sglang_ext.ple.bench import add_bench_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_ext.ple", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
