"""Extend (prefill) attention: each request's new tokens attend to its compressed prefix, read from the planes
through kv_indices (which cover the prefix only, as in SGLang), and to the new tokens themselves, causally.
With new_slots (speculative verify; every extend when serving with SGLANG_EXT_KV_EXTEND_NEW_TOKENS=pool) the
new tokens were stored first and are read back from the planes at their slots, through the format, as decode
reads its current token: the same bytes every later reader sees. Verify (a custom mask) decodes them in the
kernel; other extends dequantize them once into the attention basis first. Without new_slots they are taken
at full precision from k_extend / v_extend.

Octave: q, k_extend and v_extend are rotated once into the K / V bases, the kernel works in the rotated basis
throughout, and the output is un-rotated once. Grid (batch, KV head, query block): a program owns block_m new
tokens of all q heads of one KV head (GQA), so each prefix tile is decoded once for the whole group.

Prefix scratch (compressed formats): the direct kernel decodes every prefix tile once per query block, i.e.
max_len_extend / block_m times (128 times for 4096 new tokens at d128), and octave decoding is
instruction-heavy. When the batch's plan (extend_plan.plan_extend, made once per batch from host lengths) says so,
the launcher instead dequantizes the prefix once per call (dequant.dequantize_rotated: only the slots in
kv_indices, up to kv_indptr[B] read on the device) into a transient buffer of the plan's prefix_rows rows in the
attention basis (K's rotated basis for K, V's for V; bf16 when the dots take bf16 operands, else float32) and runs
the same kernel with FMT 0 over it (kv_indices = positions in the buffer, kv_indptr unchanged), a few KV heads at
a time when the whole would exceed the budget. With new_slots the new tokens are dequantized too (the same way,
into a [T, heads, D] buffer) and attended as FMT 0 rows; T is at most the prefill chunk. The rules are
extend_plan's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvformats import KVFormat, rotation
from . import tables
from .checks import check_planes
from .decode import _tanh, attention_planes, layout, level_decode, tile_tokens
from .dequant import dequantize_rotated
from .extend_plan import SCRATCH_KINDS, ExtendPlan, default_launch, plan_extend
from .rotate import rotate_rows
from .tiles import accumulate, load_q_blocks, scores, store_blocks


@triton.jit
def _extend_kernel(q_ptr, ke_ptr, ve_ptr, out_ptr, k_codes, k_scales, v_codes, v_scales,
                   qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr, new_slots, sm_scale,
                   stride_q_t, stride_q_h, stride_ke_t, stride_ke_h, stride_ve_t, stride_ve_h,
                   stride_o_t, stride_o_h,
                   stride_kc_slot, stride_kc_head, stride_ks_slot, stride_ks_head,
                   stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                   FMT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, K_N4: tl.constexpr, V_N4: tl.constexpr, NB: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, USE_CUSTOM_MASK: tl.constexpr, NEW_FROM_POOL: tl.constexpr,
                   LOGIT_CAP: tl.constexpr,
                   DOT_BF16: tl.constexpr, LUT: tl.constexpr):
    # One program: BLOCK_M new tokens x all GROUP q heads of one KV head, as rows r = token * BLOCK_G + head,
    # so every prefix tile is read and decoded once per KV head and query block, not once per q head.
    batch = tl.program_id(0)
    kv_head = tl.program_id(1)
    block_m = tl.program_id(2)
    q_start = tl.load(qo_indptr + batch).to(tl.int64)
    ext_len = tl.load(qo_indptr + batch + 1) - q_start
    if block_m * BLOCK_M < ext_len:
        kv_start = tl.load(kv_indptr + batch)
        prefix_len = tl.load(kv_indptr + batch + 1) - kv_start
        offs_r = tl.arange(0, BLOCK_M * BLOCK_G)
        offs_m = block_m * BLOCK_M + offs_r // BLOCK_G
        offs_g = offs_r % BLOCK_G
        mask_r = (offs_m < ext_len) & (offs_g < GROUP)
        heads = (kv_head * GROUP + offs_g).to(tl.int64)
        q0, q1, q2, q3 = load_q_blocks(q_ptr, (q_start + offs_m) * stride_q_t + heads * stride_q_h, mask_r, NB,
                                       DOT_BF16)
        e_max = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
        e_sum = tl.zeros([BLOCK_M * BLOCK_G], dtype=tl.float32)
        acc0 = tl.zeros([BLOCK_M * BLOCK_G, 64], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_M * BLOCK_G, 64], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M * BLOCK_G, 64], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_M * BLOCK_G, 64], dtype=tl.float32)
        # stage 1: the compressed prefix, through kv_indices
        for n0 in range(0, prefix_len, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < prefix_len
            slot = tl.load(kv_indices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
            qk = scores(FMT, q0, q1, q2, q3, k_codes, k_scales, slot * stride_kc_slot + kv_head * stride_kc_head,
                        slot * stride_ks_slot + kv_head * stride_ks_head, mask_n, K_N4, NB, BLOCK_M * BLOCK_G,
                        BLOCK_N, DOT_BF16, LUT) * sm_scale
            if LOGIT_CAP > 0:
                qk = LOGIT_CAP * _tanh(qk / LOGIT_CAP)
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            n_max = tl.maximum(tl.max(qk, 1), e_max)
            rescale = tl.exp(e_max - n_max)
            p = tl.exp(qk - n_max[:, None])
            e_sum = e_sum * rescale + tl.sum(p, 1)
            e_max = n_max
            acc0, acc1, acc2, acc3 = accumulate(
                FMT, p, acc0 * rescale[:, None], acc1 * rescale[:, None], acc2 * rescale[:, None],
                acc3 * rescale[:, None], v_codes, v_scales, slot * stride_vc_slot + kv_head * stride_vc_head,
                slot * stride_vs_slot + kv_head * stride_vs_head, mask_n, V_N4, NB, BLOCK_N, DOT_BF16, LUT)
        # stage 2: the new tokens, at full precision (already in the attention basis) or, with NEW_FROM_POOL,
        # read back from the planes at new_slots like the prefix
        if USE_CUSTOM_MASK:
            mask_start = tl.load(mask_indptr + batch).to(tl.int64)
            mask_row = prefix_len + ext_len
            ext_end = ext_len
        elif IS_CAUSAL:
            ext_end = tl.minimum((block_m + 1) * BLOCK_M, ext_len)
        else:
            ext_end = ext_len
        for n0 in range(0, ext_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < ext_len
            rows = q_start + offs_n
            if NEW_FROM_POOL:
                slot = tl.load(new_slots + rows, mask=mask_n, other=0).to(tl.int64)
                qk = scores(FMT, q0, q1, q2, q3, k_codes, k_scales, slot * stride_kc_slot + kv_head * stride_kc_head,
                            slot * stride_ks_slot + kv_head * stride_ks_head, mask_n, K_N4, NB, BLOCK_M * BLOCK_G,
                            BLOCK_N, DOT_BF16, LUT) * sm_scale
            else:
                qk = scores(0, q0, q1, q2, q3, ke_ptr, ke_ptr, rows * stride_ke_t + kv_head * stride_ke_h, rows,
                            mask_n, 0, NB, BLOCK_M * BLOCK_G, BLOCK_N, DOT_BF16, 0) * sm_scale
            if LOGIT_CAP > 0:
                qk = LOGIT_CAP * _tanh(qk / LOGIT_CAP)
            keep = mask_n[None, :]
            if USE_CUSTOM_MASK:
                bits = custom_mask + mask_start + offs_m[:, None] * mask_row + prefix_len + offs_n[None, :]
                keep = keep & (tl.load(bits, mask=mask_r[:, None] & mask_n[None, :], other=0) != 0)
            elif IS_CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            qk = tl.where(keep, qk, float("-inf"))
            n_max = tl.maximum(tl.max(qk, 1), e_max)
            rescale = tl.exp(e_max - n_max)
            p = tl.exp(qk - n_max[:, None])
            e_sum = e_sum * rescale + tl.sum(p, 1)
            e_max = n_max
            if NEW_FROM_POOL:
                acc0, acc1, acc2, acc3 = accumulate(
                    FMT, p, acc0 * rescale[:, None], acc1 * rescale[:, None], acc2 * rescale[:, None],
                    acc3 * rescale[:, None], v_codes, v_scales, slot * stride_vc_slot + kv_head * stride_vc_head,
                    slot * stride_vs_slot + kv_head * stride_vs_head, mask_n, V_N4, NB, BLOCK_N, DOT_BF16, LUT)
            else:
                acc0, acc1, acc2, acc3 = accumulate(
                    0, p, acc0 * rescale[:, None], acc1 * rescale[:, None], acc2 * rescale[:, None],
                    acc3 * rescale[:, None], ve_ptr, ve_ptr, rows * stride_ve_t + kv_head * stride_ve_h, rows,
                    mask_n, 0, NB, BLOCK_N, DOT_BF16, 0)
        store_blocks(out_ptr, (q_start + offs_m) * stride_o_t + heads * stride_o_h, mask_r, acc0, acc1, acc2, acc3,
                     1.0 / e_sum, NB)


def extend_attention(fmt: KVFormat, q_extend: torch.Tensor, k_extend: torch.Tensor, v_extend: torch.Tensor,
                     o_extend: torch.Tensor, planes: dict[str, torch.Tensor], qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, max_len_extend: int, sm_scale: float,
                     is_causal: bool = True, page_size: int = 1, logit_cap: float = 0.0,
                     block_m: int | None = None, block_n: int | None = None, dot_bf16: bool | None = None,
                     num_warps: int = 8, num_stages: int | None = None, lut: int | None = None,
                     custom_mask: torch.Tensor | None = None, mask_indptr: torch.Tensor | None = None,
                     new_slots: torch.Tensor | None = None, prefix_scratch: bool | None = None,
                     scratch_bytes: int | None = None, plan: ExtendPlan | None = None,
                     prefix_rows: int | None = None) -> torch.Tensor:
    """q_extend/o_extend [T, Hq, D], k_extend/v_extend [T, Hkv, D]; qo_indptr [B+1] over T; kv_indptr [B+1]
    and kv_indices: each request's prefix slots (token-level ids; page_size as in decode.py).
    max_len_extend must be >= every request's new-token count. dot_bf16, lut: as in decode_attention.
    block_m: new tokens per program (None: default_launch's rows_per_program / the group size rounded up to a power
    of 2); block_n: prefix / new tokens per iteration (None: default_launch's).
    custom_mask / mask_indptr (speculative verify, tree drafts): SGLang's layout, request b's row-major bool
    block [m_b, l_b + m_b] at mask_indptr[b]; it replaces the causal mask among the new tokens. Its prefix
    columns are not read: every query sees its whole prefix (as with SGLang's skip_prefix_custom_mask, the
    default of its Triton extend kernel; verify masks always have them set).
    new_slots [>= T] int: the new tokens' slots, already written by store_kv; the new tokens' K/V are then read
    from the planes there (through the format, as decode reads its current token) and k_extend / v_extend are
    not read.
    plan: an extend_plan.ExtendPlan made for this batch (the attention backend makes one per batch, from host
    lengths, and passes it to every layer; block_m, dot_bf16, prefix_scratch and scratch_bytes then go into the
    plan); None = make one here from prefix_rows (kv_indptr[B], the batch's total prefix length; None = read it
    from kv_indptr, a host synchronisation: convenient for tests and benchmarks, not for a captured CUDA graph) and
    these keywords. A plan's prefix_rows must be kv_indptr[B] (the scratch holds that many rows):
    prefix_scratch: None = extend_plan's rule; True = the prefix scratch wherever allowed; False = the direct
    kernel. scratch_bytes: the scratch budget (None: extend_plan.SCRATCH_BYTES).
    Writes every row of o_extend; returns it."""
    check_planes(fmt, planes)
    t, hq, d = q_extend.shape
    h_kv = next(iter(planes.values())).shape[1]
    assert d == fmt.head_dim, (d, fmt.head_dim)
    for name, x in (("k_extend", k_extend), ("v_extend", v_extend)):
        assert x.shape == (t, h_kv, d), f"{name}: {tuple(x.shape)}, expected {(t, h_kv, d)}"
    for name, x in (("q_extend", q_extend), ("k_extend", k_extend), ("v_extend", v_extend), ("o_extend", o_extend)):
        assert x.is_floating_point() and x.stride(-1) == 1, f"{name}: {x.dtype} {x.stride()}"
    assert o_extend.shape == q_extend.shape, (o_extend.shape, q_extend.shape)
    assert hq % h_kv == 0, f"q heads {hq} not a multiple of kv heads {h_kv}"
    assert qo_indptr.dim() == 1 and kv_indptr.shape == qo_indptr.shape, (qo_indptr.shape, kv_indptr.shape)
    assert page_size >= 1, page_size
    if custom_mask is not None:
        assert custom_mask.dtype in (torch.bool, torch.uint8) and custom_mask.dim() == 1, custom_mask.dtype
        assert mask_indptr is not None and mask_indptr.shape == qo_indptr.shape, "custom_mask needs mask_indptr [B+1]"
    if new_slots is not None:
        # >= t: a CUDA-graph batch may hand in its whole static out_cache_loc buffer; rows past t are not read
        assert new_slots.dim() == 1 and new_slots.shape[0] >= t and not new_slots.is_floating_point(), (
            new_slots.shape, new_slots.dtype)
    batch = qo_indptr.shape[0] - 1
    if batch == 0 or t == 0:
        return o_extend
    dev = q_extend.device
    if plan is None:
        if prefix_rows is None:
            prefix_rows = int(kv_indptr[batch])
        plan = plan_extend(fmt, h_kv, num_q_heads=hq, prefix_rows=prefix_rows, max_len_extend=max_len_extend,
                           verify=custom_mask is not None, info=dev, block_m=block_m, dot_bf16=dot_bf16,
                           prefix_scratch=prefix_scratch, scratch_bytes=scratch_bytes)
    else:
        assert block_m is None and dot_bf16 is None and prefix_scratch is None and scratch_bytes is None, (
            "block_m, dot_bf16, prefix_scratch and scratch_bytes go into the plan")
        assert (plan.fmt_name, plan.head_dim, plan.num_q_heads, plan.num_kv_heads) == (fmt.name, d, hq, h_kv), (
            plan, fmt.name, d, hq, h_kv)
        assert plan.scratch is None or custom_mask is None, "a plan with the prefix scratch for a custom-mask extend"
    kind, k_n4, v_n4 = layout(fmt)
    bf16_dots = plan.dot_bf16
    block_m = plan.block_m
    q_in, k_in, v_in = q_extend, k_extend, v_extend
    if fmt.rotated:
        f32 = torch.float32
        # the rotated q / k / v only ever reach the dots, so with bf16 dot operands they are stored in bf16 (the
        # kernel would round them to bf16 anyway: same values, half the bytes; with float32 copies the H200 took
        # 21.6 ms over the scratch and 48.8 direct at d128, 16.2 / 36.3 without: docs/benchmarks/
        # kernels-variants-6.json and kernels-variants-7.json); the output stays float32 for its un-rotation
        rot = torch.bfloat16 if bf16_dots else f32
        q_in = rotate_rows(q_extend, torch.empty(q_extend.shape, dtype=rot, device=dev), rotation.K_TENSOR, False)
        if new_slots is None:  # else the new tokens come from the planes, already rotated
            k_in = rotate_rows(k_extend, torch.empty(k_extend.shape, dtype=rot, device=dev), rotation.K_TENSOR, False)
            v_in = rotate_rows(v_extend, torch.empty(v_extend.shape, dtype=rot, device=dev), rotation.V_TENSOR, False)
        out = torch.empty(q_extend.shape, dtype=f32, device=dev)
    else:
        out = o_extend
    kc, ks, vc, vs = attention_planes(fmt, planes)
    group = hq // h_kv
    block_g = triton.next_power_of_2(group)
    if block_n is None:
        block_n = default_launch(fmt.name, d)["block_n"]
    block_n = tile_tokens(kind, block_n, block_m * block_g, q_extend)
    launch_opts = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    use_mask = custom_mask is not None
    mask_bits = custom_mask.view(torch.uint8) if use_mask else qo_indptr
    consts = dict(GROUP=group, BLOCK_G=block_g, BLOCK_M=block_m, BLOCK_N=block_n, NB=d // 64,
                  IS_CAUSAL=bool(is_causal), USE_CUSTOM_MASK=use_mask,
                  LOGIT_CAP=float(logit_cap), DOT_BF16=bf16_dots, **launch_opts)
    q_blocks = triton.cdiv(max(int(max_len_extend), 1), block_m)

    def launch(fmt_kind, lut_mode, k_n4_, v_n4_, kc_, ks_, vc_, vs_, indices, h0, h1, k_h, v_h, from_pool):
        # KV heads h0..h1-1: q / out as head-sliced views, k_h / v_h the new tokens' rows of those heads (the
        # kernel follows their strides); from_pool: the new tokens are read at new_slots instead
        q_h, o_h = q_in[:, h0 * group:h1 * group], out[:, h0 * group:h1 * group]
        _extend_kernel[(batch, h1 - h0, q_blocks)](
            q_h, k_h, v_h, o_h, kc_, ks_, vc_, vs_, qo_indptr, kv_indptr, indices, mask_bits,
            mask_indptr if use_mask else qo_indptr, new_slots if new_slots is not None else qo_indptr, sm_scale,
            q_h.stride(0), q_h.stride(1), k_h.stride(0), k_h.stride(1), v_h.stride(0), v_h.stride(1),
            o_h.stride(0), o_h.stride(1), kc_.stride(0), kc_.stride(1), ks_.stride(0), ks_.stride(1),
            vc_.stride(0), vc_.stride(1), vs_.stride(0), vs_.stride(1),
            FMT=fmt_kind, K_N4=k_n4_, V_N4=v_n4_, LUT=lut_mode, NEW_FROM_POOL=from_pool, **consts)

    scratch_dtype = torch.bfloat16 if bf16_dots else torch.float32
    if plan.scratch is None:
        k_new, v_new, from_pool = k_in, v_in, new_slots is not None
        if from_pool and not use_mask and kind in SCRATCH_KINDS:
            # A prefill's new tokens dequantized once into the attention basis (the kernel would decode each tile
            # of them once per query block: 1.6-2.7x the time of a 4096-token prefill on an H200); verify keeps
            # NEW_FROM_POOL (a few rows, one query block)
            k_new = torch.empty(t, h_kv, d, dtype=scratch_dtype, device=dev)
            v_new = torch.empty(t, h_kv, d, dtype=scratch_dtype, device=dev)
            dequantize_rotated(fmt, planes, new_slots, k_new, v_new, lut=lut)
            from_pool = False
        launch(kind, level_decode(q_extend, bf16_dots, lut), k_n4, v_n4, kc, ks, vc, vs, kv_indices, 0, h_kv, k_new,
               v_new, from_pool)
    else:
        rows = plan.prefix_rows  # kv_indptr[B], from host lengths; kv_indices may be longer (over-allocated)
        width = max(h1 - h0 for h0, h1 in plan.scratch)
        k_s = torch.empty(rows, width, d, dtype=scratch_dtype, device=dev)
        v_s = torch.empty(rows, width, d, dtype=scratch_dtype, device=dev)
        # the new tokens' rows, read back from the pool like the prefix (with new_slots)
        k_n = v_n = None
        if new_slots is not None:
            k_n = torch.empty(t, width, d, dtype=scratch_dtype, device=dev)
            v_n = torch.empty(t, width, d, dtype=scratch_dtype, device=dev)
        positions = torch.arange(rows, dtype=torch.int32, device=dev)
        ph = tables.identity_placeholder(dev).view(1, 1, 1)
        for h0, h1 in plan.scratch:
            k_c, v_c = k_s[:, :h1 - h0], v_s[:, :h1 - h0]
            dequantize_rotated(fmt, planes, kv_indices, k_c, v_c, head_base=h0, limit=kv_indptr[batch:],
                               lut=lut)
            if new_slots is None:
                k_h, v_h = k_in[:, h0:h1], v_in[:, h0:h1]
            else:
                k_h, v_h = k_n[:, :h1 - h0], v_n[:, :h1 - h0]
                dequantize_rotated(fmt, planes, new_slots, k_h, v_h, head_base=h0, lut=lut)
            launch(tables.FMT_BF16, 0, 0, 0, k_c, ph, v_c, ph, positions, h0, h1, k_h, v_h, False)
    if fmt.rotated:
        rotate_rows(out, o_extend, rotation.V_TENSOR, True)
    return o_extend
