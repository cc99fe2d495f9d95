"""Decode through a CUDA graph as SGLang's Triton backend runs it (GPU only): the plan is made at capture from the
bucket alone (seq_lens_sum=None: lengths unknown), the kv lists and per-request split counts live in preallocated
buffers refilled in place before every replay, and each replay with new lengths gives the reference's attention."""

from __future__ import annotations

import pytest
import torch

from sglang_ext.kernels import store_kv
from sglang_ext.kernels.decode import run_decode
from sglang_ext.kernels.decode_plan import plan_decode
from sglang_ext.kvformats import get_format, reference

MAX_BS, MAX_CTX, MAX_SPLITS = 4, 4096, 16


@pytest.mark.parametrize("name", ["bf16", "int8", "octave_k3v4", "octave_k3v3"])
@pytest.mark.parametrize("head_dim,h_q,h_kv", [(128, 16, 2), (256, 16, 4)])
def test_graph_replays_with_new_lengths_give_the_reference(name, head_dim, h_q, h_kv, device):
    if device != "cuda":
        pytest.skip("CUDA graphs: an NVIDIA GPU with TRITON_INTERPRET=0")
    fmt = get_format(name, head_dim, 64 if head_dim == 256 else None)
    gen = torch.Generator(device=device).manual_seed(head_dim)
    slots = MAX_BS * MAX_CTX + 1
    planes = fmt.allocate(slots, h_kv, device)
    store_kv(fmt, planes, torch.arange(slots, device=device),
             torch.randn(slots, h_kv, head_dim, device=device, generator=gen),
             torch.randn(slots, h_kv, head_dim, device=device, generator=gen))
    # the graph's static buffers (SGLang's cuda_graph_kv_indices is max batch x context length)
    kv_indptr = torch.zeros(MAX_BS + 1, dtype=torch.int32, device=device)
    kv_indices = torch.zeros(MAX_BS * MAX_CTX, dtype=torch.int64, device=device)
    num_kv_splits = torch.ones(MAX_BS, dtype=torch.int32, device=device)
    q = torch.zeros(MAX_BS, h_q, head_dim, dtype=torch.bfloat16, device=device)
    o = torch.empty_like(q)

    def refill(lens: list[int], splits: list[int]) -> None:
        perm = torch.randperm(slots - 1, device=device, generator=gen)[:sum(lens)] + 1
        kv_indptr[1:] = torch.tensor(lens, device=device).cumsum(0)
        kv_indices[:sum(lens)] = perm
        num_kv_splits.copy_(torch.tensor(splits, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, device=device, generator=gen))

    plan = plan_decode(fmt, planes, batch=MAX_BS, num_q_heads=h_q, q_dtype=q.dtype, seq_lens_sum=None,
                       max_kv_splits=MAX_SPLITS, kv_splits_given=True)

    def run():
        run_decode(plan, fmt, q, planes, o, kv_indptr, kv_indices, head_dim ** -0.5, num_kv_splits=num_kv_splits)

    refill([1] * MAX_BS, [1] * MAX_BS)  # capture with the bucket's dummy batch, as SGLang does
    run()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    torch.cuda.synchronize()
    for lens, splits in (([37, MAX_CTX, 1000, 1], [1, MAX_SPLITS, 7, 1]), ([5, 200, 3000, 2048], [2, 3, 16, 9])):
        refill(lens, splits)
        graph.replay()
        torch.cuda.synchronize()
        ref = reference.decode_attention(fmt, q.float(), planes, kv_indptr, kv_indices[:sum(lens)], head_dim ** -0.5)
        err = ((o.float() - ref).norm() / ref.norm()).item()
        worst = (o.float() - ref).abs().max().item()
        assert err < 1e-2 and worst < 0.03 + 0.02 * ref.abs().max().item(), (
            f"{name} d{head_dim} ({plan.stage1}, grid {plan.grid_splits}) lens {lens}: relative {err}, max {worst}")
