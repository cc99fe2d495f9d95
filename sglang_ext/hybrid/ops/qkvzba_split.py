"""Split of the GDN input projections into (mixed_qkv, z, b, a): SGLang's
`triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat` (Qwen3-Next's per-key-head interleaved layout) and
`fused_qkvzba_split_reshape_cat_contiguous` (Qwen3.5's [all q | all k | all v | all z], [all b | all a]).

Both return mixed_qkv [T, 2*H*Dk + HV*Dv] = [all q | all k | all v], z [T, HV, Dv], b [T, HV], a [T, HV], new
contiguous tensors in the inputs' dtypes.
"""

import torch


def _check(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v):
    if num_heads_v % num_heads_qk:
        raise ValueError(f"qkvzba split: {num_heads_v} value heads are not a multiple of {num_heads_qk} key heads")
    want = (2 * num_heads_qk * head_qk + 2 * num_heads_v * head_v, 2 * num_heads_v)
    if (mixed_qkvz.shape[-1], mixed_ba.shape[-1]) != want:
        raise ValueError(f"qkvzba split: widths {mixed_qkvz.shape[-1]}, {mixed_ba.shape[-1]} != {want}")


def fused_qkvzba_split_reshape_cat_contiguous(mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, num_heads_qk: int,
                                              num_heads_v: int, head_qk: int, head_v: int):
    """mixed_qkvz: [T, q | k | v | z]; mixed_ba: [T, b | a]."""
    _check(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v)
    tokens = mixed_qkvz.shape[0]
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim:].reshape(tokens, num_heads_v, head_v).contiguous()
    return mixed_qkv, z, mixed_ba[:, :num_heads_v].contiguous(), mixed_ba[:, num_heads_v:].contiguous()


def fused_qkvzba_split_reshape_cat(mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, num_heads_qk: int,
                                   num_heads_v: int, head_qk: int, head_v: int):
    """mixed_qkvz: [T, per key head (q, k, its group's v, its group's z)]; mixed_ba: [T, per key head (its
    group's b, its group's a)]."""
    _check(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v)
    tokens = mixed_qkvz.shape[0]
    group_v = num_heads_v // num_heads_qk * head_v
    per_head = mixed_qkvz.reshape(tokens, num_heads_qk, 2 * head_qk + 2 * group_v)
    q, k, v, z = torch.split(per_head, [head_qk, head_qk, group_v, group_v], dim=-1)
    mixed_qkv = torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)], dim=-1)
    ba = mixed_ba.reshape(tokens, num_heads_qk, 2 * (num_heads_v // num_heads_qk))
    b, a = torch.split(ba, num_heads_v // num_heads_qk, dim=-1)
    return (mixed_qkv, z.reshape(tokens, num_heads_v, head_v).contiguous(), b.reshape(tokens, num_heads_v).contiguous(),
            a.reshape(tokens, num_heads_v).contiguous())
