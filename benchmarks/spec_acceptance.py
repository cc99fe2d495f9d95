"""Accept length of trained MTP draft layers on held-out prompts: the "Draft acceptance" table of
docs/benchmarks/speculative.md.

    .venv/bin/python -m tools.draft_training --minutes 20 --out /tmp/mtp            # train a layer (20 minutes)
    .venv/bin/python benchmarks/spec_acceptance.py /tmp/mtp --prompts 176 --split 80 --cache /tmp/held176.pt
    .venv/bin/python benchmarks/spec_acceptance.py /tmp/mtp --prompts 176 --split 80 --cache /tmp/held176.pt \\
        --topk 4 --draft-tokens 4                                                    # tree drafts, 3 verified

The held-out continuations (greedy, float32) are made once and saved to --cache; each later run only simulates.
Time, measured with --prompts 16 on 2 CPU cores shared with other jobs (load average about 10): 536 s the first
time (about 7 minutes of it the continuations), 264 s from the cache (tree drafts, an untrained layer: every
position a verify round, the slowest case). Both grow with --prompts; 176 prompts take about 11 times as long.
The prompts are the first --prompts of the held-out topics (never trained on) in train-draft's seed-0 order, so
the first 16 are the set train-draft itself prints; each is continued greedily by up to 128 tokens. Acceptance is
train-draft's plain-torch simulation of SGLang's EAGLE drafting (tools/draft_training/draft_acceptance.py; a
served run counts the same accept length: benchmarks/spec_kv.py). Prints one JSON line per checkpoint: accept
length, verify rounds and per-depth match on the first 16, the rest and all (and, with --split N, the first N
and the rest).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is not installed

from sglang_ext.models.builtin import default_model_dir  # noqa: E402
from sglang_ext.models.mtp_checkpoint import load_config, load_mtp_weights  # noqa: E402
from tools.draft_training.draft_acceptance import measure  # noqa: E402
from tools.draft_training.draft_corpus import HELDOUT_TOPICS, generate, prompts  # noqa: E402
from tools.draft_training.mtp_layer import MtpLayer  # noqa: E402
from tools.draft_training.train_draft import load_base  # noqa: E402


def heldout(args):
    torch.set_num_threads(args.threads)
    base = default_model_dir()
    model, tokenizer = load_base(base)
    embed, lm_head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    if args.cache and os.path.exists(args.cache):
        held = torch.load(args.cache, weights_only=False)
        assert len(held) == args.prompts, f"{args.cache} holds {len(held)} continuations, not {args.prompts}"
    else:
        held_prompts = prompts(HELDOUT_TOPICS, tokenizer, args.prompts, 0)
        held = []
        for i in range(0, len(held_prompts), 16):  # train-draft's held-out batch size
            held += generate(model, tokenizer, held_prompts[i:i + 16], 128, 0.0, seed=0)
        if args.cache:
            torch.save(held, args.cache)
    del model
    for path in args.dirs:
        mtp = MtpLayer(load_config(base))
        mtp.load_state_dict(load_mtp_weights(path))
        row = {"checkpoint": path, "steps": args.steps, "topk": args.topk,
               "draft_tokens": args.draft_tokens or args.steps + 1}
        parts = [("first16", held[:16]), ("rest", held[16:]), ("all", held)]
        if args.split:  # e.g. 80: the 80 prompts of the published table and the ones after them
            parts += [(f"first{args.split}", held[:args.split]), (f"after{args.split}", held[args.split:])]
        for name, part in parts:
            r = measure(mtp.eval(), embed, lm_head, [s for s in part if s is not None], args.steps, args.topk,
                        args.draft_tokens)
            row[name] = {"accept": round(r.mean_accept_length, 4), "rounds": r.rounds,
                         "match": [round(m, 4) for m in r.per_step_match]}
        print(json.dumps(row), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dirs", nargs="+", help="MTP checkpoint folders (python -m tools.draft_training --out)")
    parser.add_argument("--prompts", type=int, default=80)
    parser.add_argument("--cache", default="", help="file for the held-out continuations (made once, then reused)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--split", type=int, default=0, help="also measure the first N prompts and the rest apart")
    parser.add_argument("--steps", type=int, default=3, help="--speculative-num-steps")
    parser.add_argument("--topk", type=int, default=1, help="--speculative-eagle-topk (> 1: tree drafts)")
    parser.add_argument("--draft-tokens", type=int, default=0,
                        help="--speculative-num-draft-tokens (default steps + 1: 3 verified drafts at 3 steps)")
    heldout(parser.parse_args())


if __name__ == "__main__":
    main()
