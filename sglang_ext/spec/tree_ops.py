"""Draft-tree construction ops in plain torch: the CPU platform's implementation and the spec the Triton
kernels (`sglang_ext/kernels/spec_tree.py`) are tested against. No SGLang import.

Semantics follow SGLang 0.5.23's ops of the same names (`kernels/ops/speculative/reconstruct_tree.py`,
`spec_tree.py`, CUDA `jit/csrc/speculative/tree.cuh`). Tree links use -1 for "none". Every output argument is
written in place, exactly as the SGLang op does, because SGLang's callers pass preallocated views.
"""

import torch


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,  # bool [bs * n * n]; tree_mask[b, i, j]: node j is an ancestor of (or is) node i
    verified_seq_len: torch.Tensor,  # int [bs]
    positions: torch.Tensor,  # int64 [bs * n] (out)
    retrieve_index: torch.Tensor,  # int64 [bs, n] (out)
    retrieve_next_token: torch.Tensor,  # int64 [bs, n] (out): first child, -1 if leaf
    retrieve_next_sibling: torch.Tensor,  # int64 [bs, n] (out): next node with the same parent, -1 if none
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from the n x n ancestor mask of each request's draft tree (node 0 is the root)."""
    if batch_size == 0:
        return
    n = draft_token_num
    device = tree_mask.device
    order = torch.arange(n, device=device)
    anc = tree_mask.view(batch_size, n, n).bool() & (order[None, None, :] < order[None, :, None])  # strict
    depth = anc.sum(-1)  # [bs, n]
    positions.view(batch_size, n).copy_(depth + verified_seq_len.view(-1, 1).to(depth.dtype))
    retrieve_index.view(batch_size, n).copy_(torch.arange(batch_size * n, device=device).view(batch_size, n))
    # parent[i] = largest ancestor index, -1 for a root.
    parent = torch.where(anc, order[None, None, :], torch.full_like(anc, -1, dtype=torch.long)).amax(-1)
    # first child of t = smallest k with anc[k, t] (a node's smallest descendant is always a child).
    child_idx = torch.where(anc, order[None, :, None], torch.full_like(anc, n, dtype=torch.long)).amin(1)
    retrieve_next_token.view(batch_size, n).copy_(torch.where(child_idx < n, child_idx, -1))
    # next sibling of t = smallest k > t with parent[k] == parent[t]; -1 for roots.
    same = (parent[:, :, None] == parent[:, None, :]) & (order[None, :, None] > order[None, None, :])  # [b, k, t]
    sib_idx = torch.where(same, order[None, :, None], torch.full_like(same, n, dtype=torch.long)).amin(1)
    retrieve_next_sibling.view(batch_size, n).copy_(torch.where((sib_idx < n) & (parent >= 0), sib_idx, -1))


def build_tree_efficient(
    parent_list: torch.Tensor,  # int64 [bs, topk * (depth - 1) + 1]: flat score index of each parent slot
    selected_index: torch.Tensor,  # int64 [bs, n - 1]: flat score index of each selected draft token (sorted)
    verified_seq_len: torch.Tensor,  # int [bs]
    tree_mask: torch.Tensor,  # bool (out); FULL_MASK layout or QLEN_ONLY layout, see below
    positions: torch.Tensor,  # int64 [bs * n] (out)
    retrieve_index: torch.Tensor,  # int64 [bs, n] (out)
    retrieve_next_token: torch.Tensor,  # int64 [bs, n] (in: -1 filled; out)
    retrieve_next_sibling: torch.Tensor,  # int64 [bs, n] (in: -1 filled; out)
    topk: int,
    depth: int,
    draft_token_num: int,
    full_mask: bool,
) -> None:
    """EAGLE tree from the draft steps' top-k selections (SGLang `build_tree_kernel_efficient`).

    Node 0 is the verified (bonus) token; node i >= 1 is selected_index[i - 1]. Its parent slot is
    selected_index[i - 1] // topk: slot 0 is the root, slot s > 0 is the draft token whose flat index is
    parent_list[s]. FULL_MASK: request b's rows start at n*n*b + n*sum(seq_len[:b]), each row (seq_len + n) wide,
    the prefix columns left as the caller filled them. QLEN_ONLY: rows are n wide at n*n*b.
    Mask rows and positions are written for every node; the sibling links follow the CUDA op's order
    (children are linked by scanning i from n-1 down to 1, so the first child is the smallest index).
    """
    bs = verified_seq_len.numel()
    n = draft_token_num
    sel = selected_index.view(bs, -1).tolist()
    par = parent_list.view(bs, -1).tolist() if parent_list.numel() else [[] for _ in range(bs)]
    seq = verified_seq_len.tolist()
    prefix = 0
    nxt = retrieve_next_token.view(bs, n)
    sib = retrieve_next_sibling.view(bs, n)
    ridx = retrieve_index.view(bs, n)
    pos = positions.view(bs, n)
    for b in range(bs):
        # parent position (node index) of node i, -1 if its parent cannot be found
        def parent_node(i: int) -> int:
            slot = sel[b][i - 1] // topk
            if slot == 0:
                return 0
            token = par[b][slot]
            for pp in range(n - 1):
                if sel[b][pp] == token:
                    return pp + 1
            return -1

        parents = [-1] + [parent_node(i) for i in range(1, n)]
        ridx[b] = torch.arange(b * n, (b + 1) * n, device=ridx.device)
        for i in range(n - 1, 0, -1):
            p = parents[i]
            if p >= 0:
                prev = int(nxt[b, p])
                nxt[b, p] = i
                if prev != -1:
                    sib[b, i] = prev
        if full_mask:
            base = n * n * b + prefix * n
            width = seq[b] + n
            rows = tree_mask[base:base + n * width].view(n, width)[:, seq[b]:]
        else:
            rows = tree_mask[n * n * b:n * n * (b + 1)].view(n, n)
        rows.zero_()
        pos[b, 0] = seq[b]
        rows[0, 0] = True
        for x in range(1, n):
            rows[x, 0] = True
            cur, d = x, 0
            # walk up at most `depth` ancestors, as the CUDA op does
            for _ in range(depth):
                rows[x, cur] = True
                d += 1
                p = parents[cur]
                if p <= 0:
                    break
                cur = p
            pos[b, x] = seq[b] + d
        prefix += seq[b]
