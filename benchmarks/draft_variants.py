"""Compare train-draft training settings on one saved corpus (docs/speculative-decoding.md, method comparison).

    python benchmarks/draft_variants.py corpus --seconds 720 --out /tmp/draft_corpus.pt
    python benchmarks/draft_variants.py train --corpus /tmp/draft_corpus.pt --name J --seconds 600 --threads 1 \\
        --set lr=2e-3 single_step_share=0.75 [--tokens N]
    python benchmarks/draft_variants.py heldout --prompts 80 --cache /tmp/heldout80.pt DIR [DIR ...]

`corpus` generates as train-draft did until 2026-11-30 (the 16 held-out prompts with the first batch, then batches of
48 training prompts, greedy and T=0.8 alternating) until the time is up, saving after every batch; with
`--like-train-draft` as train-draft does now (the held-out prompts on their own, then its batches of 128). `train` runs train-draft's
linear start (unless `linear_start_ridge=0`) and `fit_layer` with DraftTrainConfig overrides for a fixed time,
measures the held-out acceptance (chain, and tree drafts of the same verified tokens) with the weights rounded to
bf16 (as the checkpoint stores them), and prints one JSON line (the load average included). `heldout` measures written checkpoints on more held-out prompts than
train-draft's 16: the first `--prompts` of the held-out topics in train-draft's seed-0 order (so its first 16 are
train-draft's own set), continued greedily in float32 (saved to `--cache` and reused), one JSON line per checkpoint
with the accept length on the first 16, the rest and all.
"""

import argparse
import ast
import json
import os
import random
import time

import torch

from sglang_ext.models.builtin import default_model_dir
from sglang_ext.models.draft_acceptance import measure
from sglang_ext.models.draft_corpus import HELDOUT_TOPICS, generate, prompts, train_prompts
from sglang_ext.models.draft_loss import corpus_vocab
from sglang_ext.models.mtp_checkpoint import (fixed_seed_mtp_weights, load_config, load_mtp_weights,
                                              write_mtp_checkpoint)
from sglang_ext.models.mtp_layer import MtpLayer
from sglang_ext.models.train_draft import DraftTrainConfig, corpus_batch, fit_layer, linear_start, load_base


def make_corpus(args):
    start = time.monotonic()
    model, tokenizer = load_base(default_model_dir())
    held_prompts, pool = prompts(HELDOUT_TOPICS, tokenizer, 16, 0), train_prompts(tokenizer, 0)
    if args.like_train_draft:
        return _corpus_like_train_draft(args, start, model, tokenizer, held_prompts, pool)
    held, corpus, b = [], [], 0
    while time.monotonic() - start < args.seconds and (b + 1) * 48 <= len(pool):
        chunk, temperature = pool[b * 48:(b + 1) * 48], (0.8 if b % 2 else 0.0)
        if b == 0:
            chunk = held_prompts + chunk
        t = time.monotonic()
        generated = generate(model, tokenizer, chunk, 128, temperature, seed=b)
        if b == 0:
            held, generated = [s for s in generated[:16] if s is not None], generated[16:]
        new = [s for s in generated if s is not None]
        corpus += [(b, temperature, s) for s in new]
        made = sum(len(s.tokens) - s.prompt_len for s in new)
        print(f"batch {b} T={temperature}: {made} generated tokens in {time.monotonic() - t:.0f} s; corpus "
              f"{sum(len(s.tokens) for _, _, s in corpus)} tokens at {time.monotonic() - start:.0f} s", flush=True)
        torch.save({"held": held, "corpus": corpus}, args.out)
        b += 1


def _corpus_like_train_draft(args, start, model, tokenizer, held_prompts, pool):
    """train-draft's corpus phase: the held-out prompts first, then batches of corpus_batch_prompts in the order
    and with the temperatures of train_draft.corpus_batch, later batches stopping at the deadline."""
    config = DraftTrainConfig()
    held = [s for s in generate(model, tokenizer, held_prompts, 128, 0.0, seed=0) if s is not None]
    model.to(config.resolved_corpus_dtype())  # as train_draft: the held-out text in float32, the corpus not
    corpus, b = [], 0
    while time.monotonic() - start < args.seconds:
        indices, temperature = corpus_batch(b, len(pool), config)
        generated = generate(model, tokenizer, [pool[j] for j in indices], config.new_tokens, temperature, seed=b,
                             deadline=start + args.seconds if b else None)
        corpus += [(b, temperature, s) for s in generated if s is not None]
        b += 1
        print(f"batch {b} T={temperature}: corpus {sum(len(s.tokens) for _, _, s in corpus)} tokens at "
              f"{time.monotonic() - start:.0f} s", flush=True)
        torch.save({"held": held, "corpus": corpus}, args.out)


def train(args):
    torch.set_num_threads(args.threads)
    config = DraftTrainConfig(**{k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in args.set)})
    base = default_model_dir()
    saved = torch.load(args.corpus, weights_only=False)
    held, corpus = saved["held"], [s for _, _, s in saved["corpus"]]
    if args.tokens:
        kept, n = [], 0
        for s in corpus:
            if n >= args.tokens:
                break
            kept.append(s)
            n += len(s.tokens)
        corpus = kept
    model, _ = load_base(base)
    embed, lm_head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    del model
    rng = random.Random(config.seed)  # the same split rule as train_draft
    shuffled = rng.sample(corpus, len(corpus))
    n_val = min(round(len(corpus) * config.validation_share), 32)
    validation, training = shuffled[:n_val], shuffled[n_val:]
    mtp = MtpLayer(load_config(base))
    mtp.load_state_dict(fixed_seed_mtp_weights(base, config.seed))
    start = time.monotonic()  # as in train_draft: the linear start and the vocabulary are part of the time
    if config.linear_start_ridge > 0:
        linear_start(mtp, embed, training, config.linear_start_ridge)
    fit = fit_layer(mtp, embed, lm_head, training, validation, corpus_vocab(training, config.vocab_limit), config,
                    deadline=start + args.seconds, rng=rng, log=lambda *_: None)
    seconds = time.monotonic() - start
    stored = mtp.to(torch.bfloat16).float().eval()
    acc = measure(stored, embed, lm_head, held, config.draft_steps)
    tree = measure(stored, embed, lm_head, held, config.draft_steps, config.tree_topk)
    row = {"name": args.name, "set": args.set, "corpus_tokens": sum(len(s.tokens) for s in corpus),
           "train_sequences": len(training), "steps": fit.steps, "train_s": round(seconds),
           "best_step": fit.best_step, "accept": round(acc.mean_accept_length, 4),
           "tree_accept": round(tree.mean_accept_length, 4),
           "match": [round(m, 4) for m in acc.per_step_match], "positions": acc.positions,
           "validation": fit.validation, "load": os.getloadavg()}
    if args.heldout_cache:  # the continuations `heldout --cache` made (its --prompts of them)
        more = [s for s in torch.load(args.heldout_cache, weights_only=False) if s is not None]
        row[f"heldout{len(more)}"] = {
            "chain": round(measure(stored, embed, lm_head, more, config.draft_steps).mean_accept_length, 4),
            "tree": round(measure(stored, embed, lm_head, more, config.draft_steps,
                                  config.tree_topk).mean_accept_length, 4)}
    if args.out:
        write_mtp_checkpoint(base, args.out, {k: v.detach() for k, v in stored.state_dict().items()})
    print(json.dumps(row), flush=True)


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
        if args.split:  # e.g. 80: the 80 prompts of earlier comparisons and the ones after them
            parts += [(f"first{args.split}", held[:args.split]), (f"after{args.split}", held[args.split:])]
        for name, part in parts:
            r = measure(mtp.eval(), embed, lm_head, [s for s in part if s is not None], args.steps, args.topk,
                        args.draft_tokens)
            row[name] = {"accept": round(r.mean_accept_length, 4), "rounds": r.rounds,
                         "match": [round(m, 4) for m in r.per_step_match]}
        print(json.dumps(row), flush=True)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--seconds", type=float, default=720)
    c.add_argument("--out", required=True)
    c.add_argument("--like-train-draft", action="store_true",
                   help="train-draft's batches (128 prompts, its order, temperatures and deadline)")
    t = sub.add_parser("train")
    t.add_argument("--corpus", required=True)
    t.add_argument("--name", required=True)
    t.add_argument("--seconds", type=float, default=600)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--tokens", type=int, default=0, help="only the first corpus sequences, up to this many tokens")
    t.add_argument("--set", nargs="*", default=[], help="DraftTrainConfig overrides, key=python-literal")
    t.add_argument("--heldout-cache", default="", help="also measure on these held-out continuations (a "
                   "`heldout --cache` file)")
    t.add_argument("--out", default="", help="write the trained layer here (a servable MTP checkpoint folder)")
    h = sub.add_parser("heldout")
    h.add_argument("dirs", nargs="+", help="MTP checkpoint folders (train-draft --out)")
    h.add_argument("--prompts", type=int, default=80)
    h.add_argument("--cache", default="", help="file for the held-out continuations (made once, then reused)")
    h.add_argument("--threads", type=int, default=2)
    h.add_argument("--split", type=int, default=0, help="also measure the first N prompts and the rest apart")
    h.add_argument("--steps", type=int, default=3, help="--speculative-num-steps")
    h.add_argument("--topk", type=int, default=1, help="--speculative-eagle-topk (> 1: tree drafts)")
    h.add_argument("--draft-tokens", type=int, default=0,
                   help="--speculative-num-draft-tokens (default steps + 1: 3 verified drafts at 3 steps)")
    args = parser.parse_args()
    {"corpus": make_corpus, "train": train, "heldout": heldout}[args.command](args)


if __name__ == "__main__":
    main()
