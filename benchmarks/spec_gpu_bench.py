"""Speculative decoding on a GPU without SGLang: the "On a GPU (standalone, H200)" tables of
docs/benchmarks/speculative.md: (a) our Triton spec kernels against the torch ops, (b) step times of the built-in
model's shape: decode, chain and tree verify of 4 tokens, draft steps, over SDPA and our KV pool formats.

    # on a CUDA GPU, no SGLang needed (the second command ran 164 s on an H200)
    PYTHONUNBUFFERED=1 python3 benchmarks/spec_gpu_bench.py --out OUT_DIR
    PYTHONUNBUFFERED=1 python3 benchmarks/spec_gpu_bench.py --skip-kernels --kernels-json \
        docs/benchmarks/spec-gpu-h200-batch8.json --attention sdpa bf16 int8 octave_k3v4 octave_k3v3 \
        --batches 1 8 --tree-topk 4 --out OUT_DIR
    # on a CPU, tiny sizes under the Triton interpreter (checks the harness only; its timings mean nothing)
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/spec_gpu_bench.py --quick --out /tmp/sgb

(a) Every Triton spec kernel (sglang_ext/kernels/spec_*.py) on random inputs at batch 1 and 8 against its torch op
(sglang_ext/spec/*_ops.py): integer outputs must be equal; the sampling kernel gets the same uniform draws as the
torch op. Outputs are poisoned before each run. Both are timed (median of repeated launches, host-synchronised,
since the torch ops read tensors on the host).
(b) SmolLM2-135M's shape (30 layers, hidden 576, 9 heads, 3 KV heads, head_dim 64, MLP 1536, vocab 49152, tied
embeddings) with random bf16 weights in plain torch, each step captured in a CUDA graph: one decode step, one
target-verify step over 4 tokens, one MTP draft step (1 decoder layer + lm_head), at context 1k and 8k.
Attention is torch SDPA with the GQA groups folded into the query rows (flash for decode, memory-efficient with a
mask for verify); RMSNorm is torch's rms_norm; RoPE tables are computed outside the graph. Unfused elsewhere, so
a step costs more kernels than in a serving engine; decode and verify pay that alike.
Speed-up model: accept_len x t_decode / (t_verify + 3 t_draft + t_spec_ops) with t_spec_ops the measured time of
the per-round Triton ops at the same batch size (greedy: verify_tree_greedy; sampling: tree sampling verify; plus
assign_extend_cache_locs and fill_accept_out_cache_loc), once as pipelined launches, once host-synchronised.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglang_ext.kernels import spec_cache_locs, spec_sampling, spec_tree  # noqa: E402
from sglang_ext.spec import cache_loc_ops, tree_ops, verify_ops  # noqa: E402

ACCEPT_LENGTHS = (1.3, 1.6, 1.67, 1.72, 1.8, 2.0, 2.5)
SHAPE = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, mlp=1536, vocab=49152)


def host_time_us(fn, reps: int) -> float:
    """Median wall time of fn() in microseconds, synchronising the device around each call."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------------------- (a)

def _random_tree_links(bs, n, chain, rng):
    parents_all, masks = [], []
    for _ in range(bs):
        parents = [-1] + [(i - 1 if chain else rng.randrange(i)) for i in range(1, n)]
        m = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j != -1:
                m[i, j] = True
                j = parents[j]
        parents_all.append(parents)
        masks.append(m)
    mask = torch.stack(masks).flatten()
    out = torch.empty((4, bs, n), dtype=torch.int64)
    tree_ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs, dtype=torch.long), out[0].view(-1), out[1],
                                                out[2], out[3], bs, n)
    return mask, out[1], out[2], out[3]


def pipelined_time_us(fn, reps: int) -> float:
    """Device time per call of `reps` back-to-back calls with no synchronisation between them (CUDA events): what
    a launch costs when the host keeps ahead of the device (the launcher's Python and the launch itself)."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000 / reps


def _compare(name, bs, run_torch, run_triton, reps):
    """run_*() -> tuple of output tensors. Exact equality of every output; both timed."""
    want = run_torch()
    got = run_triton()
    equal = all(torch.equal(g.cpu(), w.cpu()) for g, w in zip(got, want))
    row = {"op": name, "batch": bs, "exact_match": equal,
           "torch_us": round(host_time_us(run_torch, reps), 1), "triton_us": round(host_time_us(run_triton, reps), 1)}
    if torch.cuda.is_available():
        row["triton_pipelined_us"] = round(pipelined_time_us(run_triton, reps), 1)
    print(f"{name:<34} bs={bs:<2} match={equal!s:<5} torch {row['torch_us']:>9.1f} us"
          f"  triton {row['triton_us']:>7.1f} us"
          f"  pipelined {row.get('triton_pipelined_us', float('nan')):>6.1f} us", flush=True)
    return row


def kernel_rows(device, vocab, reps, seed=0):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rows = []
    for bs in (1, 8):
        # NGRAM metadata from a tree mask (n 8)
        mask, *_ = _random_tree_links(bs, 8, False, rng)
        mask, seq = mask.to(device), torch.randint(10, 4000, (bs,), device=device)

        def reconstruct(fn, mask=mask, seq=seq, bs=bs):
            outs = [torch.full((bs, 8), -9, dtype=torch.int64, device=device) for _ in range(4)]
            fn(mask, seq, outs[0].view(-1), *outs[1:], bs, 8)
            return outs
        rows.append(_compare("reconstruct_indices_from_tree_mask n8", bs,
                             lambda f=tree_ops.reconstruct_indices_from_tree_mask: reconstruct(f),
                             lambda f=spec_tree.reconstruct_indices_from_tree_mask: reconstruct(f), reps))
        # EAGLE tree build, topk 4, 3 steps, 8 verify tokens; and NEXTN's chain (topk 1, n 4)
        for topk, depth, n in ((1, 3, 4), (4, 3, 8)):
            total = topk + (depth - 1) * topk * topk
            parent_rows, sel_rows = [], []
            for _ in range(bs):
                row = [-1] + list(range(topk))
                for step in range(1, depth - 1):
                    row += [topk + topk * topk * (step - 1) + c for c in rng.sample(range(topk * topk), topk)]
                parent_rows.append(row)
                sel_rows.append(sorted([0] + rng.sample(range(1, total), n - 2)))
            plist = torch.tensor(parent_rows, device=device)
            sel = torch.tensor(sel_rows, device=device)
            seq = torch.randint(10, 4000, (bs,), device=device)
            mask_len = int(seq.sum()) * n + n * n * bs

            def build(fn, plist=plist, sel=sel, seq=seq, topk=topk, depth=depth, n=n, mask_len=mask_len, bs=bs):
                mask = torch.ones(mask_len, dtype=torch.bool, device=device)
                pos = torch.full((bs * n,), -7, dtype=torch.int64, device=device)
                links = torch.full((3, bs, n), -1, dtype=torch.int64, device=device)
                fn(plist, sel, seq, mask, pos, links[0], links[1], links[2], topk, depth, n, True)
                return mask, pos, links
            rows.append(_compare(f"build_tree_efficient topk{topk} n{n}", bs,
                                 lambda f=tree_ops.build_tree_efficient, b=build: b(f),
                                 lambda f=spec_tree.build_tree_efficient, b=build: b(f), reps))
        # verification: greedy on a chain (NEXTN, n 4) and a tree (n 8); sampling with the same coins
        for n, chain in ((4, True), (8, False)):
            _, ridx, nxt, sib = (t.to(device) for t in _random_tree_links(bs, n, chain, rng))
            cand = torch.randint(0, 3, (bs, n), device=device)
            target = torch.randint(0, 3, (bs, n), device=device)

            def greedy(fn, ridx=ridx, nxt=nxt, sib=sib, cand=cand, target=target, bs=bs, n=n):
                pred = torch.full((bs * n,), -5, dtype=torch.int32, device=device)
                acc = torch.full((bs, n), -1, dtype=torch.int32, device=device)
                num = torch.full((bs,), -5, dtype=torch.int32, device=device)
                fn(pred, acc, num, cand, ridx, nxt, sib, target)
                return pred, acc, num
            rows.append(_compare(f"verify_tree_greedy n{n}", bs,
                                 lambda f=verify_ops.verify_tree_greedy, g=greedy: g(f),
                                 lambda f=spec_tree.verify_tree_greedy, g=greedy: g(f), reps))
            logits = torch.randn(bs, n, vocab, device=device) * 2
            logits[:, :, :3] += 3 + math.log(vocab)  # a few likely tokens, so drafts among them are accepted
            target_probs = torch.softmax(logits, -1)
            coins, final = torch.rand(bs, n, device=device), torch.rand(bs, device=device)

            def sampling(fn, on_cpu, ridx=ridx, nxt=nxt, sib=sib, cand=cand, tp=target_probs, coins=coins,
                         final=final, bs=bs, n=n):
                dev = "cpu" if on_cpu else device
                pred = torch.full((bs * n,), -5, dtype=torch.int32, device=dev)
                acc = torch.full((bs, n), -1, dtype=torch.int32, device=dev)
                num = torch.full((bs,), -5, dtype=torch.int32, device=dev)
                draft = torch.zeros_like(tp, device=dev)
                args = [t.to(dev) for t in (cand, ridx, nxt, sib, coins, final)]
                fn(pred, acc, num, *args, tp.to(dev).clone(), draft)
                return pred, acc, num, draft
            # The torch op indexes probabilities element by element on the host (numpy float32): it runs on a CPU
            # copy, as on the CPU platform; its time includes the device-to-host copy of the probabilities.
            row = _compare(f"tree_speculative_sampling n{n} V{vocab}", bs,
                           lambda f=verify_ops.tree_speculative_sampling_target_only, s=sampling: s(f, True),
                           lambda f=spec_sampling.tree_speculative_sampling_target_only, s=sampling: s(f, False), reps)
            row["accepted_drafts"] = int(sampling(verify_ops.tree_speculative_sampling_target_only, True)[2].sum())
            row["torch_on"] = "cpu copy"
            rows.append(row)
        # KV slot bookkeeping
        req_to_token = torch.randint(0, 1 << 20, (64, 9000), dtype=torch.int32, device=device)
        reqs = torch.randperm(64, device=device)[:bs]
        start = torch.randint(0, 8000, (bs,), device=device)
        end = start + 4
        rows.append(_compare("assign_extend_cache_locs w4", bs,
                             lambda: (cache_loc_ops.assign_extend_cache_locs(reqs, req_to_token, start, end),),
                             lambda: (spec_cache_locs.assign_extend_cache_locs(reqs, req_to_token, start, end),), reps))
        accept_index = torch.full((bs, 4), -1, dtype=torch.int32, device=device)
        for b in range(bs):
            k = rng.randrange(1, 5)
            accept_index[b, :k] = torch.arange(b * 4, b * 4 + k, dtype=torch.int32)
        loc = torch.randint(0, 1 << 20, (bs * 4,), device=device)

        def fill(fn):
            out = torch.full((bs * 4,), -3, dtype=torch.int64, device=device)
            fn(accept_index, loc, out)
            return (out,)
        rows.append(_compare("fill_accept_out_cache_loc", bs, lambda: fill(cache_loc_ops.fill_accept_out_cache_loc),
                             lambda: fill(spec_cache_locs.fill_accept_out_cache_loc), reps))
    return rows


# ---------------------------------------------------------------------------------------------------------- (b)

class TinyLlama:
    """SmolLM2-135M-shaped decoder with random bf16 weights and a static KV cache of `batch` sequences, all at the
    same context length."""

    def __init__(self, layers, hidden, heads, kv_heads, head_dim, mlp, vocab, max_ctx, device, batch=1):
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g) * 0.02).to(device=device, dtype=torch.bfloat16)
        self.h, self.nh, self.nkv, self.hd, self.batch = hidden, heads, kv_heads, head_dim, batch
        self.embed = w(vocab, hidden)  # tied: also the lm_head
        self.layers = [dict(qkv=w((heads + 2 * kv_heads) * head_dim, hidden), o=w(hidden, heads * head_dim),
                            gate_up=w(2 * mlp, hidden), down=w(hidden, mlp),
                            n1=torch.ones(hidden, device=device, dtype=torch.bfloat16),
                            n2=torch.ones(hidden, device=device, dtype=torch.bfloat16)) for _ in range(layers)]
        self.norm = torch.ones(hidden, device=device, dtype=torch.bfloat16)
        # KV cache per layer: [batch, kv_heads, max_ctx, head_dim], random (never attend to zeros)
        self.k_cache = [torch.randn(batch, kv_heads, max_ctx, head_dim, generator=g).to(device, torch.bfloat16)
                        for _ in range(layers)]
        self.v_cache = [torch.randn(batch, kv_heads, max_ctx, head_dim, generator=g).to(device, torch.bfloat16)
                        for _ in range(layers)]
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
        self.fmt, self.planes, self.index = None, None, None
        self.verify_kernel = "decode"  # pool modes: chain verify through "decode" (q_len > 1) or "extend"
        self.tree = None  # tree_mask_bits of a draft tree (made once per step shape) to verify instead of a chain

    def use_pool(self, fmt_name: str) -> None:
        """Attend through our kernels over pool planes of `fmt_name` (bf16, int8, octave_*) instead of SDPA:
        decode_attention for one new token, extend_attention over the stored drafts (new_slots, as NEXTN's
        verify reads them) for several. Request b's token at position p lives in slot b * max_ctx + p; the
        planes start as the quantized random cache."""
        from sglang_ext import kernels
        from sglang_ext.kvformats import get_format
        self.fmt = get_format(fmt_name, head_dim=self.hd, rotary_dim=self.hd)
        b, hkv, max_ctx, hd = self.k_cache[0].shape
        slots = torch.arange(b * max_ctx, device=self.embed.device)
        self.planes = []
        for k, v in zip(self.k_cache, self.v_cache):
            planes = self.fmt.allocate(b * max_ctx, hkv, self.embed.device)
            kernels.store_kv(self.fmt, planes, slots, k.permute(0, 2, 1, 3).reshape(-1, hkv, hd),
                             v.permute(0, 2, 1, 3).reshape(-1, hkv, hd))
            self.planes.append(planes)
        self.max_ctx = max_ctx

    def pool_index(self, ctx: int, q_len: int) -> dict:
        """Index tensors of a step at context ctx with q_len new tokens per request (built outside the graph)."""
        dev, b, m = self.embed.device, self.batch, self.max_ctx
        base = torch.arange(b, device=dev)[:, None] * m
        new = (base + ctx + torch.arange(q_len, device=dev)).reshape(-1)
        if q_len == 1:  # decode: the new token is stored first and read from the pool
            seen = (base + torch.arange(ctx + 1, device=dev)).reshape(-1)
            indptr = torch.arange(b + 1, device=dev, dtype=torch.int32) * (ctx + 1)
        else:
            seen = (base + torch.arange(ctx, device=dev)).reshape(-1)
            indptr = torch.arange(b + 1, device=dev, dtype=torch.int32) * ctx
        return {"new": new, "kv_indices": seen.to(torch.int32), "kv_indptr": indptr,
                "qo_indptr": torch.arange(b + 1, device=dev, dtype=torch.int32) * q_len}

    def pool_attention(self, i, q, k, v):
        """q [b, q_len, heads, d], k/v [b, q_len, kv_heads, d] -> [b * q_len, heads * d] through our kernels."""
        from sglang_ext import kernels
        b, q_len = q.shape[:2]
        ix = self.index
        kernels.store_kv(self.fmt, self.planes[i], ix["new"], k.reshape(-1, self.nkv, self.hd).contiguous(),
                         v.reshape(-1, self.nkv, self.hd).contiguous())
        qf = q.reshape(b * q_len, self.nh, self.hd).contiguous()
        o = torch.empty_like(qf)
        if q_len == 1:
            kernels.decode_attention(self.fmt, qf, self.planes[i], o, ix["kv_indptr"], ix["kv_indices"],
                                     self.hd ** -0.5)
        elif self.verify_kernel == "decode":  # verify split over the prefix (what the GPU backend runs)
            kernels.decode_attention(self.fmt, qf, self.planes[i], o, ix["kv_indptr"], ix["kv_indices"],
                                     self.hd ** -0.5, q_len=q_len, new_slots=ix["new"], tree_mask=self.tree)
        else:
            kf = k.reshape(-1, self.nkv, self.hd).contiguous()
            kernels.extend_attention(self.fmt, qf, kf, v.reshape(-1, self.nkv, self.hd).contiguous(), o,
                                     self.planes[i], ix["qo_indptr"], ix["kv_indptr"], ix["kv_indices"], q_len,
                                     self.hd ** -0.5, new_slots=ix["new"])
        return o.view(b * q_len, -1)

    def rope_tables(self, pos):
        """cos, sin [q, head_dim / 2] for positions pos (computed once per step shape, outside the graph, as
        serving engines cache them)."""
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        return ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)

    def rms(self, x, weight):
        return torch.nn.functional.rms_norm(x, (self.h,), weight, 1e-5)

    def layer(self, i, x, rope, ctx, attn_mask):
        p = self.layers[i]
        b = self.batch
        q_len, group, half = x.shape[0] // b, self.nh // self.nkv, self.hd // 2
        qkv = (self.rms(x, p["n1"]) @ p["qkv"].t()).view(b, q_len, -1)
        qk = qkv[..., :(self.nh + self.nkv) * self.hd].view(b, q_len, self.nh + self.nkv, self.hd)
        cos, sin = rope[0][None, :, None, :], rope[1][None, :, None, :]
        x1, x2 = qk[..., :half], qk[..., half:]
        qk = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)  # rotate-half RoPE (Llama)
        v = qkv[..., (self.nh + self.nkv) * self.hd:].view(b, q_len, self.nkv, self.hd)
        if self.fmt is not None:
            x = x + self.pool_attention(i, qk[:, :, :self.nh], qk[:, :, self.nh:], v) @ p["o"].t()
            gate, up = (self.rms(x, p["n2"]) @ p["gate_up"].t()).chunk(2, -1)
            return x + (torch.nn.functional.silu(gate) * up) @ p["down"].t()
        self.k_cache[i][:, :, ctx:ctx + q_len] = qk[:, :, self.nh:].transpose(1, 2)
        self.v_cache[i][:, :, ctx:ctx + q_len] = v.transpose(1, 2)
        kk, vv = self.k_cache[i][:, :, :ctx + q_len], self.v_cache[i][:, :, :ctx + q_len]
        # GQA folded into the query rows: q head h reads kv head h // group, so [b, kv_heads, group * q, d] queries
        # attend to [b, kv_heads, ctx, d] keys with no head expansion.
        q = qk[:, :, :self.nh].transpose(1, 2).reshape(b, self.nkv, group * q_len, self.hd)
        o = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=attn_mask)
        o = o.view(b, self.nh, q_len, self.hd).transpose(1, 2).reshape(b * q_len, -1)
        x = x + o @ p["o"].t()
        gate, up = (self.rms(x, p["n2"]) @ p["gate_up"].t()).chunk(2, -1)
        return x + (torch.nn.functional.silu(gate) * up) @ p["down"].t()

    def forward(self, tokens, rope, ctx, layers, attn_mask=None, extra=None):
        x = self.embed[tokens]
        if extra is not None:  # MTP: project [embedding, previous hidden] back to hidden
            x = torch.cat((x, extra), -1) @ self.eh_proj.t()
        for i in layers:
            x = self.layer(i, x, rope, ctx, attn_mask)
        return self.rms(x, self.norm) @ self.embed.t()


def graph_time_us(fn, reps: int) -> float:
    """Capture fn in a CUDA graph and return the median replay time (CUDA events) in microseconds."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(10):
        graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


# A verify tree of 4 tokens as `--speculative-eagle-topk 4 --speculative-num-draft-tokens 4` often makes: the
# verified token, two candidates for the next position, and a child of the first. Token j sees tree[j].
TREE4 = ((1, 0, 0, 0), (1, 1, 0, 0), (1, 0, 1, 0), (1, 1, 0, 1))


def model_rows(device, reps, contexts, shape, batch=1, attention=("sdpa",), tree_topk=0):
    """Step times per attention mode: "sdpa" (torch SDPA over the bf16 cache) or a KV format name (our decode /
    extend kernels over pool planes of that format: TinyLlama.use_pool). A pool mode's row also carries the
    relative difference of its decode-step logits from SDPA's over the same cache (max |a - b| / max |a|).
    tree_topk > 1: also a 4-token verify with the TREE4 mask and a draft step of tree_topk branch rows per request
    (SGLang's draft decode with topk > 1: each branch a row over the prefix and its own slots)."""
    model = TinyLlama(**shape, max_ctx=max(contexts) + 16, device=device, batch=batch)
    branches = None
    if tree_topk > 1:  # the draft's branch rows: one decoder layer at batch x topk rows
        branches = TinyLlama(**dict(shape, layers=1), max_ctx=max(contexts) + 16, device=device,
                             batch=batch * tree_topk)
        branches.eh_proj = (torch.randn(shape["hidden"], 2 * shape["hidden"]) * 0.02).to(device, torch.bfloat16)
    model.eh_proj = (torch.randn(shape["hidden"], 2 * shape["hidden"]) * 0.02).to(device, torch.bfloat16)
    mtp_layer = [0]  # one decoder layer (its own weights in a real MTP module; the shape is what matters here)
    all_layers = range(shape["layers"])
    one = torch.tensor([5] * batch, device=device)
    four = torch.tensor([5, 6, 7, 8] * batch, device=device)
    rows = []
    sdpa_logits = {}
    for mode in attention:
        if mode == "sdpa":
            model.fmt = None
            if branches is not None:
                branches.fmt = None
        else:
            model.use_pool(mode)
            if branches is not None:
                branches.use_pool(mode)
        for ctx in contexts:
            rope1 = model.rope_tables(torch.tensor([ctx], device=device))
            rope4 = model.rope_tables(torch.arange(ctx, ctx + 4, device=device))
            # verify: draft token i sees the context and drafts 0..i; rows repeated per folded query head
            verify_mask = torch.ones(4, ctx + 4, dtype=torch.bool, device=device)
            verify_mask[:, ctx:] = torch.tril(torch.ones(4, 4, dtype=torch.bool, device=device))
            verify_mask = verify_mask.repeat(shape["heads"] // shape["kv_heads"], 1)
            hidden_prev = torch.randn(batch, shape["hidden"], device=device, dtype=torch.bfloat16)
            idx1 = model.pool_index(ctx, 1) if model.fmt is not None else None
            idx4 = model.pool_index(ctx, 4) if model.fmt is not None else None
            with torch.inference_mode():
                model.index = idx1
                logits = model.forward(one, rope1, ctx, all_layers).float()
                if mode == "sdpa":
                    sdpa_logits[ctx] = logits
                t_decode = graph_time_us(lambda: model.forward(one, rope1, ctx, all_layers), reps)
                model.index = idx4
                t_verify = graph_time_us(lambda: model.forward(four, rope4, ctx, all_layers, verify_mask), reps)
                t_verify_extend = None
                if model.fmt is not None:  # the same verify through the extend kernel, for comparison
                    model.verify_kernel = "extend"
                    t_verify_extend = graph_time_us(lambda: model.forward(four, rope4, ctx, all_layers), reps)
                    model.verify_kernel = "decode"
                model.index = idx1
                t_draft = graph_time_us(lambda: model.forward(one, rope1, ctx, mtp_layer, extra=hidden_prev), reps)
                t_tree = t_draft_k = None
                if branches is not None:
                    tree = torch.tensor(TREE4, dtype=torch.bool, device=device)
                    tree_mask = torch.ones(4, ctx + 4, dtype=torch.bool, device=device)
                    tree_mask[:, ctx:] = tree
                    tree_mask = tree_mask.repeat(shape["heads"] // shape["kv_heads"], 1)
                    from sglang_ext.kernels.decode import tree_mask_bits
                    model.index, model.tree = idx4, tree_mask_bits(tree[None].expand(batch, -1, -1))
                    t_tree = graph_time_us(lambda: model.forward(four, rope4, ctx, all_layers, tree_mask), reps)
                    model.tree = None
                    k_rows = torch.tensor([5] * batch * tree_topk, device=device)
                    hidden_k = torch.randn(batch * tree_topk, shape["hidden"], device=device, dtype=torch.bfloat16)
                    branches.index = branches.pool_index(ctx, 1) if branches.fmt is not None else None
                    t_draft_k = graph_time_us(lambda: branches.forward(k_rows, rope1, ctx, [0], extra=hidden_k),
                                              reps)
            row = {"batch": batch, "context": ctx, "attention": mode, "t_decode_us": round(t_decode, 1),
                   "t_verify4_us": round(t_verify, 1), "t_draft_us": round(t_draft, 1)}
            if t_tree is not None:
                row |= {"tree_topk": tree_topk, "t_verify4_tree_us": round(t_tree, 1),
                        "t_draft_topk_us": round(t_draft_k, 1)}
            if t_verify_extend is not None:
                row["t_verify4_extend_kernel_us"] = round(t_verify_extend, 1)
            if mode != "sdpa" and ctx in sdpa_logits:
                ref = sdpa_logits[ctx]
                row["logits_rel_diff_vs_sdpa"] = float((logits - ref).abs().max() / ref.abs().max())
            rows.append(row)
            print(f"batch {batch} ctx {ctx:>5} {mode:<12}: decode {t_decode:7.1f} us  verify(4) {t_verify:7.1f} us  "
                  f"draft {t_draft:7.1f} us  verify/decode {t_verify / t_decode:.2f}"
                  + (f"  (extend kernel: {t_verify_extend:.1f} us)" if t_verify_extend is not None else "")
                  + (f"  logits vs sdpa {row['logits_rel_diff_vs_sdpa']:.2e}" if "logits_rel_diff_vs_sdpa" in row
                     else "")
                  + (f"  tree verify(4) {t_tree:7.1f} us  draft x{tree_topk} {t_draft_k:7.1f} us" if t_tree else ""),
                  flush=True)
    return rows


def speedup_rows(model, kernels):
    """accept_len x t_decode / (t_verify + 3 t_draft + t_spec_ops) per batch, context, verify mode, accept len,
    and op timing (pipelined launches, or each launch followed by a host synchronisation); the ops timed at the
    model row's batch size."""
    out = []
    for timing, key in (("pipelined", "triton_pipelined_us"), ("host-synced", "triton_us")):
        for m in model:
            def t(op, key=key, bs=m.get("batch", 1)):
                return next(r[key] for r in kernels if r["batch"] == bs and r["op"].startswith(op))
            bookkeeping = t("assign_extend_cache_locs") + t("fill_accept_out_cache_loc")
            spec_ops = {"greedy": t("verify_tree_greedy n4") + bookkeeping,
                        "sampling": t("tree_speculative_sampling n4") + bookkeeping}
            # the chain: 3 draft steps of one row; the tree (topk k): the draft extend's row, then 2 steps of k rows
            drafts = {"chain": 3 * m["t_draft_us"]}
            if "t_verify4_tree_us" in m:
                drafts["tree"] = m["t_draft_us"] + 2 * m["t_draft_topk_us"]
            for draft, t_drafts in drafts.items():
                t_verify = m["t_verify4_us"] if draft == "chain" else m["t_verify4_tree_us"]
                for mode, t_ops in spec_ops.items():
                    denom = t_verify + t_drafts + t_ops
                    out.append({"batch": m.get("batch", 1), "context": m["context"],
                                "attention": m.get("attention", "sdpa"), "drafts": draft, "verify": mode,
                                "op_timing": timing, "t_spec_ops_us": round(t_ops, 1),
                                **{f"speedup_at_{a}": round(a * m["t_decode_us"] / denom, 2)
                                   for a in ACCEPT_LENGTHS}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="small vocab and model, few repeats (interpreter)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes of the step-time model")
    ap.add_argument("--attention", nargs="+", default=["sdpa"],
                    help="step-time model attention: sdpa and/or KV formats through our kernels (bf16 int8 ...)")
    ap.add_argument("--skip-kernels", action="store_true", help="only the step-time model (needs --kernels-json)")
    ap.add_argument("--tree-topk", type=int, default=0,
                    help="> 1: also time a 4-token tree verify (TREE4) and draft steps of this many branch rows")
    ap.add_argument("--kernels-json", default=None, help="spec op timings from an earlier run (its spec_gpu.json)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
    import triton
    result["triton"] = triton.__version__
    vocab = 64 if args.quick else SHAPE["vocab"]
    if args.skip_kernels:
        result["kernels"] = json.loads(Path(args.kernels_json).read_text())["kernels"]
        result["kernels_from"] = args.kernels_json
    else:
        result["kernels"] = kernel_rows(device, vocab, reps=3 if args.quick else 50)
    (out / "spec_gpu.json").write_text(json.dumps(result, indent=1))
    if device == "cuda":
        shape = SHAPE if not args.quick else dict(SHAPE, layers=2)
        result["model"] = [row for batch in args.batches for row in
                           model_rows(device, reps=20 if args.quick else 200, contexts=(1024, 8192), shape=shape,
                                      batch=batch, attention=args.attention, tree_topk=args.tree_topk)]
        result["speedup_model"] = speedup_rows(result["model"], result["kernels"])
        (out / "spec_gpu.json").write_text(json.dumps(result, indent=1))
        print("\nbatch context attention    drafts verify   op timing    t_spec_ops  "
              + "  ".join(f"acc {a}" for a in ACCEPT_LENGTHS))
        for r in result["speedup_model"]:
            print(f"{r['batch']:>5} {r['context']:>7} {r['attention']:<12} {r['drafts']:<6} {r['verify']:<8} "
                  f"{r['op_timing']:<12} "
                  f"{r['t_spec_ops_us']:>8.1f}us  "
                  + "  ".join(f"{r[f'speedup_at_{a}']:>7.2f}" for a in ACCEPT_LENGTHS))
    bad = [r for r in result["kernels"] if not r["exact_match"]]
    print(f"\n{len(result['kernels']) - len(bad)} of {len(result['kernels'])} kernel comparisons exact")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
