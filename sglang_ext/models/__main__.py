"""`python -m sglang_ext.models prepare [--out DIR] [--force]`: the last line printed is the model folder."""

import argparse
import sys

from sglang_ext.models.builtin import ModelPrepareError, prepare


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_ext.models")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="convert the built-in SmolLM2 GGUF into a bf16 safetensors folder")
    p.add_argument("--out", default=None, help="target folder (default: $SGLANG_EXT_HOME/models/SmolLM2-135M-Instruct)")
    p.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    args = parser.parse_args(argv)
    try:
        path = prepare(args.out, force=args.force)
    except ModelPrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
