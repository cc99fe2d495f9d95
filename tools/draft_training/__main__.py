"""`python -m tools.draft_training [--minutes 20] [--out DIR] [--base DIR] [--seed 0] [--threads 2]`: train the
MTP draft layer of the built-in model (train-draft); the last line printed is the checkpoint folder. Exit status 2
with one line on stderr when the base model is missing."""

import argparse
import sys

from sglang_ext.models.builtin import ModelPrepareError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.draft_training",
                                     description="train the MTP draft layer (NEXTN) of the built-in model on CPU")
    parser.add_argument("--minutes", type=float, default=20.0, help="time budget, generation and measurement included")
    parser.add_argument("--out", default=None,
                        help="checkpoint folder (default: $SGLANG_EXT_HOME/models/SmolLM2-135M-Instruct-MTP)")
    parser.add_argument("--base", default=None, help="base model folder (default: the prepared built-in model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)

    import torch

    from tools.draft_training.train_draft import DraftTrainConfig, train_draft

    torch.set_num_threads(args.threads)
    config = DraftTrainConfig(minutes=args.minutes, seed=args.seed)
    try:
        result = train_draft(config, base_dir=args.base, out_dir=args.out)
    except ModelPrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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


if __name__ == "__main__":
    sys.exit(main())
