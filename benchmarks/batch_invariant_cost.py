"""What the CPU platform's batch-invariant mode costs the projections of one forward step (in-process, no server).

    python benchmarks/batch_invariant_cost.py [--reps 20]

SmolLM2-135M's linear layers as the MiMo target serves them (30 layers of fused qkv 960x576 with bias, o 576x576,
gate_up 3072x576, down 576x1536) and its 49152x576 lm_head, float32, random weights (timing does not depend on
values). Per step shape: decode (1 row) and a NEXTN verify of 4 rows, each batched (flag off) and one row at a time
(`batch_invariant.one_row_at_a_time`, flag on); attention is not included. The variants run interleaved, rep by
rep, and the medians are printed, so load from other jobs hits all of them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from sglang_ext.platform.batch_invariant import one_row_at_a_time

LAYERS, HIDDEN, INTER, QKV, VOCAB = 30, 576, 1536, 960, 49152


def weights():
    g = torch.Generator().manual_seed(0)

    def w(n, k):
        return torch.randn(n, k, generator=g) / k**0.5

    # distinct tensors per layer (537 MB in all, more than the L3 cache), as in the model
    layers = [((w(QKV, HIDDEN), torch.zeros(QKV)), w(HIDDEN, HIDDEN), w(2 * INTER, HIDDEN), w(HIDDEN, INTER))
              for _ in range(LAYERS)]
    return layers, w(VOCAB, HIDDEN)


def step(layers, lm_head, x, rows_alone: bool):
    linear = (lambda a, w, b=None: one_row_at_a_time(F.linear, a, w, b)) if rows_alone else F.linear
    h = x
    for (wqkv, bqkv), wo, wgu, wd in layers:
        linear(h, wqkv, bqkv)
        h = linear(h, wo)
        gu = linear(h, wgu)
        h = linear(F.silu(gu[:, :INTER]) * gu[:, INTER:], wd)
    return linear(h, lm_head)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    layers, lm_head = weights()
    variants = {(m, alone): torch.randn(m, HIDDEN) for m in (1, 4) for alone in (False, True)}
    times = {k: [] for k in variants}
    for _ in range(2):
        for (m, alone), x in variants.items():
            step(layers, lm_head, x, alone)
    for _ in range(args.reps):
        for (m, alone), x in variants.items():
            t = time.perf_counter()
            step(layers, lm_head, x, alone)
            times[(m, alone)].append(time.perf_counter() - t)
    print(f"torch threads {torch.get_num_threads()}, reps {args.reps}, 1-min load average {os.getloadavg()[0]:.1f}")
    print("| rows | batched (flag off), ms | one row at a time (flag on), ms | on / off |")
    print("| --- | --- | --- | --- |")
    for m in (1, 4):
        off, on = statistics.median(times[(m, False)]) * 1e3, statistics.median(times[(m, True)]) * 1e3
        print(f"| {m} | {off:.1f} | {on:.1f} | {on / off:.2f} |")


if __name__ == "__main__":
    main()
