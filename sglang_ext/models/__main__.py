"""`python -m sglang_ext.models prepare [--out DIR] [--force]`: the last line printed is the model folder.
`python -m sglang_ext.models prepare --tiny NAME`: write a tiny seeded random-weight test model (models/tiny.py);
the last line printed is its folder.
(Training a draft layer for the built-in model is lab tooling: `python -m tools.draft_training` from the repository.)"""

import argparse
import sys

from sglang_ext.models.builtin import ModelPrepareError, prepare


def _prepare_tiny(args) -> int:
    from sglang_ext.models.tiny import TINY_MODELS, prepare_tiny

    if args.tiny not in TINY_MODELS:
        print(f"error: unknown tiny model {args.tiny!r}; known: {', '.join(sorted(TINY_MODELS))}", file=sys.stderr)
        return 2
    if args.out is not None or args.force:
        print("error: --tiny takes neither --out nor --force (its folder is $SGLANG_EXT_HOME/models/tiny-NAME)",
              file=sys.stderr)
        return 2
    print(prepare_tiny(args.tiny))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_ext.models")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="convert the built-in SmolLM2 GGUF into a bf16 safetensors folder")
    p.add_argument("--out", default=None, help="target folder (default: $SGLANG_EXT_HOME/models/SmolLM2-135M-Instruct)")
    p.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    p.add_argument("--tiny", default=None, metavar="NAME",
                   help="write the tiny random-weight test model NAME instead (see sglang_ext/models/tiny.py)")
    args = parser.parse_args(argv)
    try:
        if args.tiny is not None:
            return _prepare_tiny(args)
        path = prepare(args.out, force=args.force)
    except ModelPrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
