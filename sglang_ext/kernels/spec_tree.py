"""Triton kernels for draft-tree metadata and greedy tree verification (speculative decoding).

The torch ops in `sglang_ext/spec/tree_ops.py` and `verify_ops.py` are the spec; tests compare the two under
TRITON_INTERPRET=1, and `python -m sglang_ext.kernels.targets` builds both for sm_80/86/90 and gfx1100.
One program per request; n (draft tokens per request) is small (<= 64), so a request's n x n mask fits a tile.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _reconstruct_tree_kernel(mask_ptr, seq_len_ptr, positions_ptr, retrieve_index_ptr, next_token_ptr,
                             next_sibling_ptr, N: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    idx = tl.arange(0, BLOCK_N)
    row = idx[:, None]  # node i
    col = idx[None, :]  # candidate ancestor j
    valid = (row < N) & (col < N)
    m = tl.load(mask_ptr + b * N * N + row * N + col, mask=valid, other=0) != 0
    anc = m & (col < row)
    depth = tl.sum(anc.to(tl.int32), axis=1)
    seq = tl.load(seq_len_ptr + b).to(tl.int64)
    parent = tl.max(tl.where(anc, col, -1), axis=1)  # indexed by i
    first_child = tl.min(tl.where(anc, row, N), axis=0)  # indexed by column t
    same = (parent[:, None] == parent[None, :]) & (row > col) & (row < N)  # [k, t]: k a later sibling of t
    first_sib = tl.min(tl.where(same, row, N), axis=0)
    keep = idx < N
    out = b * N + idx
    tl.store(positions_ptr + out, depth.to(tl.int64) + seq, mask=keep)
    tl.store(retrieve_index_ptr + out, out.to(tl.int64), mask=keep)
    tl.store(next_token_ptr + out, tl.where(first_child < N, first_child, -1).to(tl.int64), mask=keep)
    tl.store(next_sibling_ptr + out, tl.where((parent >= 0) & (first_sib < N), first_sib, -1).to(tl.int64),
             mask=keep)


def reconstruct_indices_from_tree_mask(tree_mask, verified_seq_len, positions, retrieve_index, retrieve_next_token,
                                       retrieve_next_sibling, batch_size: int, draft_token_num: int) -> None:
    """Same contract as sglang_ext.spec.tree_ops.reconstruct_indices_from_tree_mask."""
    n = draft_token_num
    assert tree_mask.is_contiguous() and tree_mask.numel() >= batch_size * n * n
    for t in (positions, retrieve_index, retrieve_next_token, retrieve_next_sibling):
        assert t.dtype == torch.int64 and t.is_contiguous() and t.numel() >= batch_size * n
    if batch_size == 0:
        return
    _reconstruct_tree_kernel[(batch_size,)](tree_mask, verified_seq_len, positions, retrieve_index,
                                            retrieve_next_token, retrieve_next_sibling, N=n,
                                            BLOCK_N=max(triton.next_power_of_2(n), 2))


@triton.jit
def _verify_tree_greedy_kernel(predicts_ptr, accept_index_ptr, accept_num_ptr, candidates_ptr, retrieve_index_ptr,
                               next_token_ptr, next_sibling_ptr, target_ptr, STEPS: tl.constexpr, N: tl.constexpr):
    b = tl.program_id(0)
    base = b * N
    last = tl.load(retrieve_index_ptr + base).to(tl.int64)
    tl.store(accept_index_ptr + b * STEPS, last.to(tl.int32))
    accepted = 0
    cur = tl.zeros((), dtype=tl.int64)
    going = 1
    for _ in range(1, STEPS):
        if going == 1:
            cur = tl.load(next_token_ptr + base + cur).to(tl.int64)
            target = tl.load(target_ptr + last).to(tl.int64)
            found = 0
            for _s in range(N):
                if found == 0:
                    if cur == -1:
                        found = -1
                    else:
                        token = tl.load(candidates_ptr + base + cur).to(tl.int64)
                        if token == target:
                            found = 1
                        else:
                            cur = tl.load(next_sibling_ptr + base + cur).to(tl.int64)
            if found == 1:
                tl.store(predicts_ptr + last, target.to(tl.int32))
                accepted += 1
                last = tl.load(retrieve_index_ptr + base + cur).to(tl.int64)
                tl.store(accept_index_ptr + b * STEPS + accepted, last.to(tl.int32))
            else:
                going = 0
    tl.store(accept_num_ptr + b, accepted)
    tl.store(predicts_ptr + last, tl.load(target_ptr + last).to(tl.int32))


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
                       retrieve_next_sibling, target_predict) -> None:
    """Same contract as sglang_ext.spec.verify_ops.verify_tree_greedy (int32 outputs, contiguous inputs)."""
    bs, n = candidates.shape
    assert predicts.dtype == accept_index.dtype == accept_token_num.dtype == torch.int32
    for t in (candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, target_predict, accept_index):
        assert t.is_contiguous()
    assert target_predict.numel() == bs * n and retrieve_index.shape == (bs, n)
    if bs == 0:
        return
    _verify_tree_greedy_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                      retrieve_next_token, retrieve_next_sibling, target_predict,
                                      STEPS=accept_index.shape[1], N=n)


@triton.jit
def _build_tree_kernel(parent_list_ptr, selected_ptr, seq_len_ptr, prefix_ptr, mask_ptr, positions_ptr,
                       retrieve_index_ptr, next_token_ptr, next_sibling_ptr, parent_stride, selected_stride,
                       TOPK: tl.constexpr, DEPTH: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr,
                       FULL_MASK: tl.constexpr):
    b = tl.program_id(0)
    idx = tl.arange(0, BLOCK_N)
    row = idx[:, None]
    col = idx[None, :]
    # parent node of node i (i >= 1): its slot sel[i-1] // topk; slot 0 = root, slot s = the node whose selected
    # index equals parent_list[s] (first match), -1 if none matches.
    sel_i = tl.load(selected_ptr + b * selected_stride + idx - 1, mask=(idx >= 1) & (idx < N), other=0)
    slot = sel_i // TOPK
    token = tl.load(parent_list_ptr + b * parent_stride + slot, mask=(idx >= 1) & (idx < N) & (slot > 0), other=-1)
    sel_col = tl.load(selected_ptr + b * selected_stride + idx, mask=idx < N - 1, other=-2)
    match = (sel_col[None, :] == token[:, None]) & (col < N - 1)
    first = tl.min(tl.where(match, col, N), axis=1)
    parent = tl.where(slot == 0, 0, tl.where(first < N, first + 1, -1))
    parent = tl.where((idx >= 1) & (idx < N), parent, -1)
    # walk each node up at most DEPTH ancestors, as the CUDA op does
    cur = idx
    alive = (idx >= 1) & (idx < N)
    depth = tl.zeros((BLOCK_N,), dtype=tl.int64)
    anc = (col == 0) & (row < N)
    for _ in range(DEPTH):
        anc = anc | ((col == cur[:, None]) & alive[:, None])
        depth += alive.to(tl.int64)
        p = tl.sum(tl.where(col == cur[:, None], parent[None, :], 0), axis=1)
        alive = alive & (p > 0)
        cur = tl.where(alive, p, cur)
    seq = tl.load(seq_len_ptr + b).to(tl.int64)
    keep = idx < N
    out = b * N + idx
    tl.store(positions_ptr + out, seq + depth, mask=keep)
    tl.store(retrieve_index_ptr + out, out.to(tl.int64), mask=keep)
    valid = (row < N) & (col < N)
    if FULL_MASK:
        prefix = tl.load(prefix_ptr + b).to(tl.int64)
        offs = N * N * b + prefix * N + row * (seq + N) + seq + col
    else:
        offs = N * N * b + row * N + col
    tl.store(mask_ptr + offs, anc, mask=valid)
    # first child of t = smallest i >= 1 with parent i == t; next sibling of i = smallest k > i with the same parent
    is_child = (parent[None, :] == row) & (col >= 1) & (col < N)  # [t, i]
    first_child = tl.min(tl.where(is_child, col, N), axis=1)
    tl.store(next_token_ptr + out, first_child.to(tl.int64), mask=keep & (first_child < N))
    later = (parent[None, :] == parent[:, None]) & (col > row) & (col < N) & (parent[:, None] >= 0)  # [i, k]
    next_sib = tl.min(tl.where(later, col, N), axis=1)
    tl.store(next_sibling_ptr + out, next_sib.to(tl.int64), mask=keep & (next_sib < N))


def build_tree_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
                         retrieve_next_token, retrieve_next_sibling, topk: int, depth: int, draft_token_num: int,
                         full_mask: bool) -> None:
    """Same contract as sglang_ext.spec.tree_ops.build_tree_efficient (links pre-filled with -1 by the caller)."""
    bs = verified_seq_len.numel()
    n = draft_token_num
    assert tree_mask.dtype == torch.bool and tree_mask.is_contiguous()
    assert selected_index.shape == (bs, n - 1) and selected_index.stride(1) == 1 and parent_list.stride(-1) == 1
    for t in (positions, retrieve_index, retrieve_next_token, retrieve_next_sibling):
        assert t.dtype == torch.int64 and t.is_contiguous() and t.numel() >= bs * n
    if bs == 0:
        return
    prefix = torch.cumsum(verified_seq_len, 0) - verified_seq_len
    parents = parent_list if parent_list.numel() else selected_index  # never read when every slot is the root
    _build_tree_kernel[(bs,)](parents, selected_index, verified_seq_len, prefix, tree_mask, positions,
                              retrieve_index, retrieve_next_token, retrieve_next_sibling,
                              parent_stride=parents.stride(0), selected_stride=selected_index.stride(0), TOPK=topk,
                              DEPTH=depth, N=n, BLOCK_N=max(triton.next_power_of_2(n), 2), FULL_MASK=full_mask)
