"""`python -m sglang_ext.models prepare [--out DIR] [--force]`: the last line printed is the model folder.
`python -m sglang_ext.models prepare --tiny NAME`: write a tiny seeded random-weight test model (models/tiny.py);
the last line printed is its folder.
`python -m sglang_ext.models train-draft [--minutes 20] [--out DIR]`: train the MTP draft layer; the last line
printed is the checkpoint folder."""

import argparse
import sys

from sglang_ext.models.builtin import ModelPrepareError, prepare


def _train_draft(args) -> int:
    import torch

    from sglang_ext.models.train_draft import DraftTrainConfig, train_draft

    torch.set_num_threads(args.threads)
    config = DraftTrainConfig(minutes=args.minutes, seed=args.seed)
    result = train_draft(config, base_dir=args.base, out_dir=args.out)
    after = result.after
    print(f"accept length {after['mean_accept_length']:.3f} with {config.draft_steps} draft tokens "
          f"(untrained layer: {result.before['mean_accept_length']:.3f}) over {after['rounds']} verify rounds on "
          f"held-out prompts; draft 1 / 1-2 / 1-3 match {' / '.join(f'{m:.3f}' for m in after['per_step_match'])}; "
          f"draft-1 loss {result.loss_first:.3f} -> {result.loss_last:.3f} in {result.train_steps} steps (state of "
          f"step {result.best_step} kept) on {result.corpus_tokens} corpus tokens")
    if result.after_tree is not None:
        print(f"tree drafts (--speculative-eagle-topk {config.tree_topk} --speculative-num-draft-tokens "
              f"{config.draft_steps + 1}): accept length {result.after_tree['mean_accept_length']:.3f} with "
              f"{config.draft_steps} draft tokens over {result.after_tree['rounds']} verify rounds")
    print(result.out_dir)
    return 0


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
    t = sub.add_parser("train-draft", help="train the MTP draft layer (NEXTN) of the built-in model on CPU")
    t.add_argument("--minutes", type=float, default=20.0, help="time budget, generation and measurement included")
    t.add_argument("--out", default=None,
                   help="checkpoint folder (default: $SGLANG_EXT_HOME/models/SmolLM2-135M-Instruct-MTP)")
    t.add_argument("--base", default=None, help="base model folder (default: the prepared built-in model)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    try:
        if args.command == "train-draft":
            return _train_draft(args)
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
