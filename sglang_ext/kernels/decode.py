"""Split-KV decode attention over a format's planes (SGLang triton-backend style indexing).

Plan per call: rotate q into the K basis (octave), stage 1 grid (batch, kv_head, split) — one program
handles all q heads of a KV head's group, so each K/V byte is read once per group (with q_len > 1, chain
speculative verify: all q_len x group rows) — writes partial outputs and log-sum-exps; stage 2 grid (q row,
q_head) merges the splits; octave outputs, accumulated in V's rotated basis, are un-rotated once at the end.

kv_indices hold token-level slot ids (request b's are kv_indices[kv_indptr[b]:kv_indptr[b+1]]). With
page_size > 1 SGLang hands out slots in runs of page_size consecutive ids and still passes token-level ids;
SGLang's page-aware addressing (page = slot // page_size, row = slot % page_size) reaches the same row of our
[num_slots, H, ...] planes, so page_size only has to be a positive int. A request with no KV gets zeros.
"""

from __future__ import annotations

import ctypes
import math

import torch
import triton
import triton.language as tl

from ..kvformats import KVFormat, rotation
from . import launch_table, tables
from .checks import check_planes
from .device import DeviceInfo, device_info, rocm
from .rotate import rotate_rows
from .tiles import accumulate, load_q_blocks, q_blocks_f16, q_rows, scores, store_blocks

MIN_BLOCK_KV = 32
DEFAULT_MAX_KV_SPLITS = 16
MAX_VERIFY_ROWS = 64  # q_len x group rows of one verify program (decode_attention with q_len > 1)
MAX_TREE_TOKENS = 31  # draft-tree verify: token j's visible drafts are the bits of one int32


def verify_tree_mask(custom_mask: torch.Tensor, mask_indptr: torch.Tensor, kv_indptr: torch.Tensor, batch: int,
                     n: int) -> torch.Tensor:
    """SGLang's target-verify mask (request b: a row-major bool block [n, l_b + n] at mask_indptr[b], l_b its
    prefix length from kv_indptr) -> bool [B, n, n], the drafts' columns: decode_attention's tree_mask. Device
    ops only (no host synchronisation, so it can run inside a captured CUDA graph)."""
    prefix = (kv_indptr[1:batch + 1] - kv_indptr[:batch]).long()[:, None, None]
    j = torch.arange(n, device=custom_mask.device)[None, :, None]
    t = torch.arange(n, device=custom_mask.device)[None, None, :]
    return custom_mask[mask_indptr[:batch].long()[:, None, None] + j * (prefix + n) + prefix + t].bool()


def tree_mask_bits(tree_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, n, n] (token j sees token t) -> int32 [B * n]: bit t of entry b * n + j."""
    n = tree_mask.shape[-1]
    weights = torch.ones(n, dtype=torch.int32, device=tree_mask.device) << torch.arange(n, device=tree_mask.device,
                                                                                          dtype=torch.int32)
    return (tree_mask.to(torch.int32) * weights).sum(-1, dtype=torch.int32).reshape(-1)
# Octave tiles of 16 tokens under dots of at most 32 rows give wrong attention on an H200 with Triton 3.6 (decode
# and extend, select tree and PTX lookups alike: max error 1.1-2.3 against 1e-3..9e-3 with 32-token tiles; with 64
# or 128 rows, 16-token tiles pass; the dequant kernel at 16 is right; not root-caused). The launchers raise such
# tiles to this size on a GPU; the interpreter keeps the asked size.
OCTAVE_GPU_MIN_BLOCK_N = 32


def _info(x: torch.Tensor | DeviceInfo) -> DeviceInfo:
    return x if isinstance(x, DeviceInfo) else device_info(x.device)


def tile_tokens(kind: int, block_n: int, rows: int, x: torch.Tensor | DeviceInfo) -> int:
    """block_n as launched for dots of `rows` rows: at least OCTAVE_GPU_MIN_BLOCK_N for octave on a GPU when
    rows <= 32 (see there). x: a tensor on the device, or its DeviceInfo."""
    if kind == tables.FMT_OCTAVE and _info(x).vendor in ("cuda", "hip") and rows <= 32:
        return max(block_n, OCTAVE_GPU_MIN_BLOCK_N)
    return block_n
# octave level decode (tiles.octave_levels): select tree; PTX lookups, 3-bit blocks from their packed planes; PTX
# lookups, 3-bit codes unpacked by Triton first (measured slower on an H200)
LUT_SELECT, LUT_PTX, LUT_PTX_CODES = 0, 1, 2


def default_block_n(fmt_name: str, head_dim: int) -> int:
    """Tokens per iteration of the Triton stage 1 where no launch gives one (launch_table.TRITON_BLOCK_N, else 64)."""
    return launch_table.at(launch_table.TRITON_BLOCK_N, launch_table.ANY, fmt_name, head_dim, 64)


def default_launch(fmt: KVFormat, group: int, q_len: int, info: DeviceInfo, programs: int) -> dict:
    """launch_table.TRITON_LAUNCH's entry for this call where it was measured (q_len 1, group <= 8, its
    architectures), with 4 warps and 128 tokens per iteration where its grid of at most `programs` stage-1 programs
    (batch x KV heads x max splits) would bring fewer than LAUNCH_MIN_WARPS_PER_SM warps per SM; elsewhere {}:
    decode_attention's own defaults (4 warps, 16 query rows at least)."""
    entry = launch_table.lookup(launch_table.TRITON_LAUNCH, info, fmt.name, fmt.head_dim)
    if entry is None or q_len != 1 or group > 8:
        return {}
    if programs * entry["num_warps"] >= launch_table.LAUNCH_MIN_WARPS_PER_SM * info.sms:
        return entry
    return {**{k: v for k, v in entry.items() if k != "num_stages"}, "num_warps": 4, "block_n": 128}


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _attend_tile(slot, mask_n, mask_2d, q0, q1, q2, q3, q_scale, e_max, e_sum, acc0, acc1, acc2, acc3,
                 k_codes, k_scales, v_codes, v_scales, kv_head,
                 stride_kc_slot, stride_kc_head, stride_ks_slot, stride_ks_head,
                 stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                 FMT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, K_N4: tl.constexpr,
                 V_N4: tl.constexpr, NB: tl.constexpr, LOGIT_CAP: tl.constexpr, DOT_BF16: tl.constexpr,
                 LUT: tl.constexpr, I8_F16: tl.constexpr, KV_A: tl.constexpr = False):
    """One online-softmax step over the tokens at `slot` [BLOCK_N]; mask_n [BLOCK_N]: tokens to read; mask_2d
    [BLOCK_H, BLOCK_N] or [1, BLOCK_N]: which row sees which token. KV_A: the same step transposed, K and V tiles
    as the dots' first operand (tiles.scores): q blocks [64, BLOCK_H], mask_2d [BLOCK_N, BLOCK_H] or
    [BLOCK_N, 1], accumulators [64, BLOCK_H]."""
    qk = scores(FMT, q0, q1, q2, q3, k_codes, k_scales, slot * stride_kc_slot + kv_head * stride_kc_head,
                slot * stride_ks_slot + kv_head * stride_ks_head, mask_n, K_N4, NB, BLOCK_H, BLOCK_N,
                DOT_BF16, LUT, I8_F16, KV_A)
    qk = qk * q_rows(q_scale, KV_A)
    if LOGIT_CAP > 0:
        qk = LOGIT_CAP * _tanh(qk / LOGIT_CAP)
    qk = tl.where(mask_2d, qk, float("-inf"))
    n_max = tl.maximum(tl.max(qk, 0 if KV_A else 1), e_max)
    rescale = tl.exp(e_max - n_max)
    p = tl.exp(qk - q_rows(n_max, KV_A))
    e_sum = e_sum * rescale + tl.sum(p, 0 if KV_A else 1)
    acc0 = acc0 * q_rows(rescale, KV_A)
    acc1 = acc1 * q_rows(rescale, KV_A)
    acc2 = acc2 * q_rows(rescale, KV_A)
    acc3 = acc3 * q_rows(rescale, KV_A)
    acc0, acc1, acc2, acc3 = accumulate(
        FMT, p, acc0, acc1, acc2, acc3, v_codes, v_scales, slot * stride_vc_slot + kv_head * stride_vc_head,
        slot * stride_vs_slot + kv_head * stride_vs_head, mask_n, V_N4, NB, BLOCK_N, DOT_BF16, LUT, I8_F16, KV_A)
    return n_max, e_sum, acc0, acc1, acc2, acc3


@triton.jit
def _decode_stage1(q_ptr, k_codes, k_scales, v_codes, v_scales, kv_indptr, kv_indices, num_kv_splits,
                   mid_o, mid_lse, sm_scale, new_slots, tree_bits,
                   stride_kc_slot, stride_kc_head, stride_ks_slot, stride_ks_head,
                   stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                   stride_q_b, stride_q_h, stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h,
                   FMT: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                   MIN_BLOCK: tl.constexpr, K_N4: tl.constexpr, V_N4: tl.constexpr, NB: tl.constexpr,
                   LOGIT_CAP: tl.constexpr, DOT_BF16: tl.constexpr, LUT: tl.constexpr, I8_F16: tl.constexpr,
                   Q_LEN: tl.constexpr = 1, BLOCK_T: tl.constexpr = 16, KV_A: tl.constexpr = False,
                   TREE: tl.constexpr = False):
    # Q_LEN > 1 (speculative verify): request `batch` has Q_LEN query tokens (q rows batch * Q_LEN + j); row r of
    # the program is (token j = r // GROUP, q head r % GROUP); kv_indptr / kv_indices list the prefix only, and
    # the Q_LEN new tokens, already stored, are read at new_slots[batch * Q_LEN + t] by the last split, token j
    # seeing tokens t <= j (a chain), or with TREE the tokens t whose bit t is set in tree_bits[batch * Q_LEN + j]
    # (a draft tree: each node sees its ancestors and itself).
    batch = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < GROUP * Q_LEN
    tok = offs_h // GROUP
    heads = kv_head * GROUP + offs_h % GROUP
    kv_start = tl.load(kv_indptr + batch)
    seq_len = tl.load(kv_indptr + batch + 1) - kv_start
    splits = tl.load(num_kv_splits + batch)
    per_split = tl.cdiv(tl.cdiv(seq_len, splits), MIN_BLOCK) * MIN_BLOCK
    s0 = per_split * split
    s1 = tl.minimum(s0 + per_split, seq_len)
    active = s1 > s0
    if Q_LEN > 1:
        active = active | (split == splits - 1)
    if active:
        q_rows = (batch * Q_LEN + tok) * stride_q_b + heads.to(tl.int64) * stride_q_h
        if I8_F16:
            q0, q1, q2, q3, q_amax = q_blocks_f16(*load_q_blocks(q_ptr, q_rows, mask_h, NB, False), NB)
            q_scale = q_amax * sm_scale
        else:
            q0, q1, q2, q3 = load_q_blocks(q_ptr, q_rows, mask_h, NB, DOT_BF16)
            q_scale = tl.full([BLOCK_H], sm_scale, tl.float32)
        e_max = tl.full([BLOCK_H], float("-inf"), tl.float32)
        e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
        if KV_A:  # K / V tiles as the dots' first operand: q and the accumulators transposed
            q0 = tl.trans(q0)
            q1 = tl.trans(q1)
            q2 = tl.trans(q2)
            q3 = tl.trans(q3)
            acc0 = tl.zeros([64, BLOCK_H], dtype=tl.float32)
        else:
            acc0 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
        acc1 = tl.zeros_like(acc0)
        acc2 = tl.zeros_like(acc0)
        acc3 = tl.zeros_like(acc0)
        for n0 in range(s0, s1, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < s1
            slot = tl.load(kv_indices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
            e_max, e_sum, acc0, acc1, acc2, acc3 = _attend_tile(
                slot, mask_n, mask_n[:, None] if KV_A else mask_n[None, :], q0, q1, q2, q3, q_scale, e_max, e_sum, acc0, acc1, acc2, acc3,
                k_codes, k_scales, v_codes, v_scales, kv_head, stride_kc_slot, stride_kc_head, stride_ks_slot,
                stride_ks_head, stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                FMT, BLOCK_H, BLOCK_N, K_N4, V_N4, NB, LOGIT_CAP, DOT_BF16, LUT, I8_F16, KV_A)
        if Q_LEN > 1:
            if split == splits - 1:
                offs_t = tl.arange(0, BLOCK_T)
                mask_t = offs_t < Q_LEN
                slot = tl.load(new_slots + batch * Q_LEN + offs_t, mask=mask_t, other=0).to(tl.int64)
                if TREE:
                    bits = tl.load(tree_bits + batch * Q_LEN + tok, mask=mask_h, other=0)
                    if KV_A:
                        causal = mask_t[:, None] & (((bits[None, :] >> offs_t[:, None]) & 1) != 0)
                    else:
                        causal = mask_t[None, :] & (((bits[:, None] >> offs_t[None, :]) & 1) != 0)
                elif KV_A:
                    causal = mask_t[:, None] & (offs_t[:, None] <= tok[None, :])
                else:
                    causal = mask_t[None, :] & (offs_t[None, :] <= tok[:, None])
                e_max, e_sum, acc0, acc1, acc2, acc3 = _attend_tile(
                    slot, mask_t, causal, q0, q1, q2, q3, q_scale, e_max, e_sum, acc0, acc1, acc2, acc3,
                    k_codes, k_scales, v_codes, v_scales, kv_head, stride_kc_slot, stride_kc_head, stride_ks_slot,
                    stride_ks_head, stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                    FMT, BLOCK_H, BLOCK_T, K_N4, V_N4, NB, LOGIT_CAP, DOT_BF16, LUT, I8_F16, KV_A)
        if KV_A:
            acc0 = tl.trans(acc0)
            acc1 = tl.trans(acc1)
            acc2 = tl.trans(acc2)
            acc3 = tl.trans(acc3)
        mo_rows = (batch * Q_LEN + tok) * stride_mo_b + heads.to(tl.int64) * stride_mo_h + split * stride_mo_s
        store_blocks(mid_o, mo_rows, mask_h, acc0, acc1, acc2, acc3, 1.0 / e_sum, NB)
        tl.store(mid_lse + (batch * Q_LEN + tok) * stride_ml_b + heads * stride_ml_h + split, e_max + tl.log(e_sum),
                 mask=mask_h)


@triton.jit
def _decode_stage2(mid_o, mid_lse, out_ptr, kv_indptr, num_kv_splits, sign_ptr,
                   stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h, stride_o_b, stride_o_h,
                   D: tl.constexpr, MAX_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, MIN_BLOCK: tl.constexpr,
                   Q_LEN: tl.constexpr = 1, SPLIT_MUL: tl.constexpr = 1, UNROTATE: tl.constexpr = False):
    # Every split's partial output loaded at once as one [splits, D] tile and merged by its log-sum-exp weight:
    # no chain of dependent loads (a loop over the splits was latency-bound: 6-7 us for batch 8 x 64 heads x
    # 16 splits on an H200, 13 us with 32 splits). UNROTATE (octave): the merged output is taken back out of the
    # rotated basis here, x = diag(signs) H64 y / 8 per 64-dim block (sign_ptr: the V signs, [D]), instead of by
    # a rotate_rows launch: 6.5 us at batch 8 x 32 heads x head_dim 256 (33 splits) on an H200, against 4.5 us
    # without it plus the launch's 7 us.
    batch = tl.program_id(0).to(tl.int64)  # a q row: request batch // Q_LEN
    head = tl.program_id(1)
    offs_d = tl.arange(0, D)
    # SPLITS_P2 = next_power_of_2(MAX_SPLITS), from the launcher: a kernel body must not call
    # triton.next_power_of_2, which SGLang replaces with a plain function Triton's JIT then refuses
    offs_s = tl.arange(0, SPLITS_P2)
    req = batch // Q_LEN
    seq_len = tl.load(kv_indptr + req + 1) - tl.load(kv_indptr + req)
    splits = tl.load(num_kv_splits + req) * SPLIT_MUL  # stage 1 ran num_kv_splits x SPLIT_MUL splits
    per_split = tl.cdiv(tl.cdiv(seq_len, splits), MIN_BLOCK) * MIN_BLOCK
    s0 = per_split * offs_s
    use = (tl.minimum(s0 + per_split, seq_len) > s0)  # the splits stage 1 ran
    if Q_LEN > 1:
        use = use | (offs_s == splits - 1)
    use = use & (offs_s < MAX_SPLITS)
    lse = tl.load(mid_lse + batch * stride_ml_b + head * stride_ml_h + offs_s, mask=use, other=float("-inf"))
    w = tl.where(use, tl.exp(lse - tl.maximum(tl.max(lse, axis=0), -1e30)), 0.0)  # no split: no -inf - -inf
    e_sum = tl.sum(w, axis=0)
    part = tl.load(mid_o + batch * stride_mo_b + head * stride_mo_h + offs_s[:, None] * stride_mo_s + offs_d[None, :],
                   mask=use[:, None], other=0.0)
    acc = tl.sum(w[:, None] * part, axis=0)
    out = tl.where(e_sum > 0, acc / tl.maximum(e_sum, 1e-30), 0.0)
    out_row = out_ptr + batch * stride_o_b + head * stride_o_h
    if UNROTATE:
        # dim 64 b + 8 a + c at [b, a, c]; H64 = H8 (x) H8 (Sylvester order: (-1)^popcount(i & j) factors over
        # the two octal digits), so H64 y is H8 Y H8 on each block's 8 x 8 view Y: two contractions of 8. The
        # merge above stays a [splits, D] tile and only the merged row is reshaped: merging in the
        # [splits, blocks, 8, 8] shape took stage 2 to 11.6 us.
        i8 = tl.arange(0, 8)
        dim3 = tl.arange(0, D // 64)[:, None, None] * 64 + i8[None, :, None] * 8 + i8[None, None, :]
        y = tl.reshape(out, [D // 64, 8, 8])
        both = i8[:, None] & i8[None, :]
        h8 = tl.where(((both ^ (both >> 1) ^ (both >> 2)) & 1) != 0, -1.0, 1.0)  # H8, symmetric
        t = tl.sum(h8[None, :, :, None] * y[:, None, :, :], axis=2)  # [b, a', c]: sum over a
        x = tl.sum(t[:, :, None, :] * h8[None, None, :, :], axis=3)  # [b, a', c']: sum over c
        tl.store(out_row + dim3, (x * (tl.load(sign_ptr + dim3) * 0.125)).to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_row + offs_d, out.to(out_ptr.dtype.element_ty))


_SPLITS: dict[tuple, torch.Tensor] = {}


def split_counts(batch: int, splits: int, dev: torch.device) -> torch.Tensor:
    """int32 [batch] filled with `splits`; on a GPU cached per (device, batch, splits), which spares decode a
    fill kernel, except while a CUDA graph is captured (a tensor made then holds its values only once the graph
    has run)."""
    if dev.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.full((batch,), splits, dtype=torch.int32, device=dev)
    key = (dev.index, batch, splits)
    if key not in _SPLITS:
        _SPLITS[key] = torch.full((batch,), splits, dtype=torch.int32, device=dev)
    return _SPLITS[key]


def use_bf16_dots(x: torch.Tensor | DeviceInfo, requested: bool | None) -> bool:
    """16-bit dot operands: on a GPU, not under the interpreter (where float32 keeps tests exact); `requested`
    overrides."""
    if requested is not None:
        return requested
    return _info(x).compiled_gpu


def attention_planes(fmt: KVFormat, planes: dict[str, torch.Tensor]):
    """(k_codes, k_scales, v_codes, v_scales) as the kernels take them; scales are a placeholder for bf16."""
    if tables.format_kind(fmt) == tables.FMT_BF16:
        ph = tables.identity_placeholder(planes["k"].device).view(1, 1, 1)
        return planes["k"], ph, planes["v"], ph
    if tables.format_kind(fmt) == tables.FMT_OCTAVE:  # 3-bit planes are read as int32 / int16 (tiles.octave_levels)
        for c in (planes["k_codes"], planes["v_codes"]):
            assert c.data_ptr() % 8 == 0 and c.stride(0) % 8 == 0 and c.stride(1) % 8 == 0, (c.stride(),
                                                                                             c.data_ptr())
    return planes["k_codes"], planes["k_scales"], planes["v_codes"], planes["v_scales"]


def level_decode(x: torch.Tensor | DeviceInfo, dot_bf16: bool, requested: int | None) -> int:
    """Octave level decode mode (tiles.octave_levels): the PTX lookup when the dots take bf16 operands on an
    NVIDIA GPU (not under the interpreter, not on AMD), else the select tree; `requested` overrides."""
    if requested is not None:
        assert requested in (LUT_SELECT, LUT_PTX, LUT_PTX_CODES), requested
        assert requested == LUT_SELECT or dot_bf16, "the PTX level lookup yields bf16 values: needs bf16 dot operands"
        return requested
    return LUT_PTX if dot_bf16 and _info(x).vendor == "cuda" else LUT_SELECT


I8_FLOAT32, I8_F16_BOTH, I8_F16_V = 0, 1, 2  # int8 conversion modes (tiles.kv_block's I8_F16)


def int8_f16_dots(kind: int, info: DeviceInfo, head_dim: int, dot_bf16: bool, requested: int | None) -> int:
    """int8 decode with fp16 dot operands (codes converted exactly by int8_ptx): on an NVIDIA GPU when the dots
    take 16-bit operands (not under the interpreter, not on AMD) launch_table.INT8_F16_MODE's mode for the head_dim
    (I8_F16_BOTH where it has none), else
    I8_FLOAT32; `requested` overrides (I8_F16_BOTH: K and V converted before the
    shared-memory trip; I8_F16_V: only V, K's conversion placed by Triton, after it)."""
    if kind != tables.FMT_INT8:
        return I8_FLOAT32
    if requested is not None:
        requested = int(requested)
        assert requested in (I8_FLOAT32, I8_F16_BOTH, I8_F16_V), requested
        assert requested == I8_FLOAT32 or dot_bf16, "the int8 fp16 path needs 16-bit dot operands"
        return requested
    if dot_bf16 and info.vendor == "cuda":
        return launch_table.at(launch_table.INT8_F16_MODE, launch_table.NVIDIA, "int8", head_dim, I8_F16_BOTH)
    return I8_FLOAT32


def default_maxnreg(fmt_name: str, rows: int, q_len: int, head_dim: int, info: DeviceInfo) -> int | None:
    """The register cap decode_attention launches stage 1 with when none is asked: launch_table.OCTAVE_MAXNREG's
    for octave decode (q_len 1, dots of 16 rows) on the architectures and head_dims it was measured on. Else None
    (ptxas's choice)."""
    if rows != 16 or q_len != 1:
        return None
    return launch_table.lookup(launch_table.OCTAVE_MAXNREG, info, fmt_name, head_dim)


def resident_programs(kernel, device: torch.device) -> int:
    """Programs of a compiled kernel (what its warmup returned) that fit on one SM at once: the CUDA driver's answer
    (cuOccupancyMaxActiveBlocksPerMultiprocessor) where there is one, else registers, shared memory and threads.
    The driver knows what a formula over the SM's totals misses: each of an SM's 4 schedulers owns a quarter of
    the register file, and a warp's registers come from its scheduler's quarter. The octave_k3v3 d128 launch (1
    warp, 206 registers a thread = 6,656 a warp) fits 9 warps in the SM's 65,536 registers but 2 in a quarter's
    16,384: 8 programs, as the driver says. With 9, wave_splits chose 9 splits at batch 32 x 32k: 941 us against
    808 with 16 (H200)."""
    kernel = kernel.result() if hasattr(kernel, "result") else kernel  # a compile future (asynchronous warmup)
    kernel._init_handles()
    props = torch.cuda.get_device_properties(device)
    warps = kernel.metadata.num_warps
    shared = kernel.metadata.shared
    by_driver = _driver_occupancy(kernel.function, 32 * warps, shared) if not rocm() else None
    if by_driver:
        return by_driver
    regs_per_warp = -(-kernel.n_regs * 32 // 256) * 256  # allocated per warp in units of 256 registers
    quarter_warps = props.regs_per_multiprocessor // 4 // max(1, regs_per_warp)  # warps per scheduler
    by_regs = 4 * quarter_warps // warps
    by_smem = props.shared_memory_per_multiprocessor // (shared + 1024) if shared else 32  # + 1 KB driver reserve
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def _driver_occupancy(function: int, threads: int, shared: int) -> int | None:
    """cuOccupancyMaxActiveBlocksPerMultiprocessor of a loaded CUfunction, or None without a CUDA driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    blocks = ctypes.c_int(0)
    err = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), ctypes.c_void_p(function),
                                                          ctypes.c_int(threads), ctypes.c_size_t(shared))
    return blocks.value if err == 0 and blocks.value > 0 else None


def wave_splits(programs_per_split: int, max_splits: int, slots: int, seq_len: int, block_n: int,
                min_block: int = MIN_BLOCK_KV) -> int:
    """Split count in 1..max_splits for requests of about seq_len tokens: a stage-1 grid of equal programs
    (programs_per_split x splits) runs in ceil(programs / slots) waves of `slots` resident programs, each program
    taking ceil(split length / block_n) loop iterations plus launch_table.SPLIT_OVERHEAD_ITERS, so the cost is waves x
    iterations. The largest count within 5 % of the cheapest wins (more splits: more slack when lengths
    differ)."""
    def cost(s: int) -> int:
        per_split = -(-(-(-seq_len // s)) // min_block) * min_block
        iters = max(1, -(-per_split // block_n)) + launch_table.SPLIT_OVERHEAD_ITERS
        return math.ceil(programs_per_split * s / slots) * iters

    best = min(cost(s) for s in range(1, max_splits + 1))
    return max(s for s in range(1, max_splits + 1) if cost(s) <= 1.05 * best)


def layout(fmt: KVFormat) -> tuple[int, int, int]:
    """(kind, K leading 4-bit blocks, V leading 4-bit blocks)."""
    kind = tables.format_kind(fmt)
    if kind != tables.FMT_OCTAVE:
        return kind, 0, 0
    return kind, tables.leading_4bit_blocks(fmt.k_bits), tables.leading_4bit_blocks(fmt.v_bits)


def decode_attention(fmt: KVFormat, q: torch.Tensor, planes: dict[str, torch.Tensor], o: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, sm_scale: float,
                     num_kv_splits: torch.Tensor | None = None, max_kv_splits: int = DEFAULT_MAX_KV_SPLITS,
                     page_size: int = 1, logit_cap: float = 0.0, q_len: int = 1,
                     new_slots: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                     plan=None, seq_lens_sum: int | None = None, **overrides) -> torch.Tensor:
    """q [B, Hq, D] (float), o [B, Hq, D] (written, every element); kv_indptr [>= B+1], kv_indices int32/int64.
    q_len > 1 (speculative verify): q / o hold q_len tokens per request ([B * q_len, Hq, D], request b's
    at rows b * q_len..); kv_indptr / kv_indices list each request's prefix only; the new tokens, already
    stored, are read at new_slots[b * q_len + j] (int, >= B * q_len entries), token j attending to the prefix
    and new tokens 0..j: what extend_attention(..., is_causal=True, new_slots=...) computes, split over the
    prefix like a decode step (one program reads each K/V tile once for all q_len x group rows;
    group * q_len <= MAX_VERIFY_ROWS). tree_mask (a draft tree): bool [B, q_len, q_len], token j attending to
    the prefix and the new tokens t where tree_mask[b, j, t] (q_len <= MAX_TREE_TOKENS) instead of 0..j; or the
    same as tree_mask_bits' int32 [B * q_len].
    num_kv_splits: int32 [B] splits per request (each <= max_kv_splits); None = the same count for all: on a
    GPU with fill_waves, the count <= max_kv_splits that wave_splits' model of waves x loop iterations
    prefers for the mean length (seq_lens_sum / B), else max_kv_splits.
    dot_bf16: feed the tensor-core dots bf16 operands (q, tile values, probabilities; scales stay float32);
    None = on a GPU, not under the CPU interpreter (where float32 keeps tests exact). block_n: tokens per loop
    iteration, num_warps, min_rows (query rows of a program's dots at least: a group's q_len x group rows, padded
    to a power of 2), kv_a (K / V tiles as the dots' first operand, tiles.scores): None = default_launch's
    entry, else default_block_n, 4 warps, 16 rows, False; num_stages: Triton's pipelining depth (None: the
    entry's, else Triton's default); maxnreg: registers per thread at most (None: default_maxnreg's cap, or
    ptxas's choice; 0: ptxas's choice);
    lut: octave level decode (LUT_SELECT / LUT_PTX / LUT_PTX_CODES; None: level_decode's choice). int8_f16: int8
    codes to fp16 dot operands in PTX (I8_F16_BOTH / I8_F16_V / I8_FLOAT32; None: int8_f16_dots' choice).
    stage1: "triton" (_decode_stage1), "mma" (decode_mma's Gluon kernels: octave_k3v4 / octave_k3v3 at head_dim 128,
    or 256 with rotary_dim 64, and int8 at 64, 128 or 256; block_n applies to it, default launch_table.MMA_BLOCK_N;
    the other launch arguments do not) or None: decode_mma.default_for's choice, unless dot_bf16=False or one of the
    Triton kernel's launch arguments (kv_a, min_rows, num_warps, num_stages, lut, int8_f16, maxnreg) is given. qk8,
    lazy: the mma kernel's int8 scores and lazy rescale for octave formats (mma_octave's docstring; None:
    launch_table.MMA_QK8 / MMA_LAZY / MMA_LAZY_QK8's choice).
    plan: a decode_plan.DecodePlan made for this batch (the attention backends make one per batch and pass it to
    every layer); None = make one here from seq_lens_sum (the batch's total KV length; None = read from
    kv_indptr, a host synchronisation: convenient for tests and benchmarks, not for a captured CUDA graph) and the
    keyword overrides (decode_plan.DecodeOverrides' fields: block_n, dot_bf16, num_warps, num_stages, lut,
    int8_f16, fill_waves, maxnreg, min_rows, kv_a, stage1, qk8, lazy).
    Returns o."""
    from .decode_plan import DecodeOverrides, plan_decode

    rows, hq, _ = q.shape
    assert q_len >= 1 and rows % q_len == 0, (rows, q_len)
    batch = rows // q_len
    if batch == 0:
        return o
    if plan is None:
        if seq_lens_sum is None:
            seq_lens_sum = int(kv_indptr[batch]) - int(kv_indptr[0])
        plan = plan_decode(fmt, planes, batch=batch, num_q_heads=hq, q_dtype=q.dtype, seq_lens_sum=seq_lens_sum,
                           max_kv_splits=max_kv_splits, q_len=q_len, tree=tree_mask is not None,
                           kv_splits_given=num_kv_splits is not None, index_dtype=kv_indices.dtype,
                           overrides=DecodeOverrides(**overrides))
    else:
        assert not overrides, f"launch overrides go into the plan, got {sorted(overrides)}"
    return run_decode(plan, fmt, q, planes, o, kv_indptr, kv_indices, sm_scale, num_kv_splits=num_kv_splits,
                      page_size=page_size, logit_cap=logit_cap, new_slots=new_slots, tree_mask=tree_mask)


def run_decode(plan, fmt: KVFormat, q: torch.Tensor, planes: dict[str, torch.Tensor], o: torch.Tensor,
               kv_indptr: torch.Tensor, kv_indices: torch.Tensor, sm_scale: float,
               num_kv_splits: torch.Tensor | None = None, page_size: int = 1, logit_cap: float = 0.0,
               new_slots: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's decode attention as `plan` (decode_plan.plan_decode) decided it: no decision, device query or
    host synchronisation here. Arguments as decode_attention's; num_kv_splits: the caller's per-request split
    counts when the plan was made with kv_splits_given, else None (the plan's). Returns o."""
    check_planes(fmt, planes)
    rows, hq, d = q.shape
    q_len = plan.q_len
    batch = rows // q_len
    assert plan.fmt_name == fmt.name and plan.head_dim == d == fmt.head_dim, (plan.fmt_name, plan.head_dim, d)
    assert rows == plan.batch * q_len and hq == plan.num_q_heads, (rows, hq, plan.batch, q_len, plan.num_q_heads)
    h_kv = next(iter(planes.values())).shape[1]
    assert h_kv == plan.num_kv_heads, (h_kv, plan.num_kv_heads)
    if q_len > 1:
        assert new_slots is not None and new_slots.dim() == 1 and new_slots.shape[0] >= rows, "q_len > 1 needs new_slots"
        assert not new_slots.is_floating_point(), new_slots.dtype
    tree_bits = None
    if tree_mask is not None:
        assert plan.tree, "a tree mask needs a plan made with tree=True"
        if tree_mask.dtype == torch.bool:
            assert tree_mask.shape == (batch, q_len, q_len), (tree_mask.shape, batch, q_len)
            tree_bits = tree_mask_bits(tree_mask)
        else:  # already tree_mask_bits' int32 [B * q_len] (made once for all layers of a verify step)
            assert tree_mask.dtype == torch.int32 and tree_mask.shape == (rows,), (tree_mask.dtype, tree_mask.shape)
            tree_bits = tree_mask
    else:
        assert not plan.tree, "the plan is a tree verify's: pass its tree_mask"
    assert q.is_floating_point() and q.stride(-1) == 1, (q.dtype, q.stride())
    assert o.shape == q.shape and o.stride(-1) == 1 and o.is_floating_point(), (o.shape, o.stride())
    assert kv_indptr.dim() == 1 and kv_indptr.shape[0] >= batch + 1, kv_indptr.shape
    assert kv_indptr.dtype in (torch.int32, torch.int64) and kv_indices.dtype in (torch.int32, torch.int64)
    assert page_size >= 1, page_size
    if num_kv_splits is None:
        num_kv_splits = plan.num_kv_splits
        assert num_kv_splits is not None, "the plan was made for caller split counts (kv_splits_given)"
    assert num_kv_splits.shape[0] >= batch, num_kv_splits.shape
    dev = q.device
    kc, ks, vc, vs = attention_planes(fmt, planes)
    if plan.stage1 == "mma":
        from . import decode_mma  # Gluon: imported only where it can run

        mid_o = torch.empty(rows, hq, plan.grid_splits, d, dtype=torch.float32, device=dev)
        mid_lse = torch.empty(rows, hq, plan.grid_splits, dtype=torch.float32, device=dev)
        # q goes in as the model made it: the octave kernel rotates it itself (decode_mma._rotated_q)
        decode_mma.launch_stage1((batch, h_kv, plan.grid_splits), q, kc, ks, vc, vs, kv_indptr, kv_indices,
                                 num_kv_splits, mid_o, mid_lse, sm_scale, plan.group, plan.block_n, MIN_BLOCK_KV,
                                 split_mul=plan.split_mul, qk8=plan.qk8, lazy=plan.lazy)
        return _merge(fmt, o, mid_o, mid_lse, kv_indptr, num_kv_splits, plan.grid_splits, split_mul=plan.split_mul)
    q_in = q
    if fmt.rotated:
        q_in = rotate_rows(q, torch.empty(q.shape, dtype=torch.float32, device=dev), rotation.K_TENSOR, False)
    mid_o = torch.empty(rows, hq, plan.grid_splits, d, dtype=torch.float32, device=dev)
    mid_lse = torch.empty(rows, hq, plan.grid_splits, dtype=torch.float32, device=dev)
    _decode_stage1[(batch, h_kv, plan.grid_splits)](
        q_in, kc, ks, vc, vs, kv_indptr, kv_indices, num_kv_splits, mid_o, mid_lse, sm_scale,
        new_slots if new_slots is not None else kv_indices, tree_bits if tree_bits is not None else kv_indices,
        kc.stride(0), kc.stride(1), ks.stride(0), ks.stride(1), vc.stride(0), vc.stride(1), vs.stride(0),
        vs.stride(1), q_in.stride(0), q_in.stride(1), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), LOGIT_CAP=float(logit_cap), **plan.consts)
    # stage 2 merges a tile of grid_splits partials (the count stage 1 ran), not of the caller's max_kv_splits
    return _merge(fmt, o, mid_o, mid_lse, kv_indptr, num_kv_splits, plan.grid_splits, q_len)


def _merge(fmt, o, mid_o, mid_lse, kv_indptr, num_kv_splits, grid_splits: int, q_len: int = 1,
           split_mul: int = 1) -> torch.Tensor:
    """Stage 2 (and the octave un-rotation) into o."""
    rows, hq, d = o.shape
    signs = tables.sign_table(rotation.V_TENSOR, d // 64, o.device) if fmt.rotated else mid_lse
    _decode_stage2[(rows, hq)](
        mid_o, mid_lse, o, kv_indptr, num_kv_splits, signs, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), o.stride(0), o.stride(1),
        D=d, MAX_SPLITS=grid_splits, SPLITS_P2=triton.next_power_of_2(grid_splits), MIN_BLOCK=MIN_BLOCK_KV,
        Q_LEN=q_len, SPLIT_MUL=split_mul,
        UNROTATE=fmt.rotated)
    return o


def mma_max_splits(batch: int, h_kv: int, seq_len: int, slots: int, sms: int, max_kv_splits: int) -> int:
    """The most splits decode_mma's launch may take for requests of about seq_len tokens (wave_splits then
    chooses up to it): the rules of launch_table.MMA_MAX_SPLITS and the constants beside it."""
    t = launch_table
    target = slots if seq_len >= t.MMA_LONG_CONTEXT else t.MMA_SHORT_PROGRAMS_PER_SM * sms
    want = max(max_kv_splits, -(-target // (batch * h_kv)))
    return max(1, min(t.MMA_MAX_SPLITS, want, seq_len // t.MMA_MIN_SPLIT_TOKENS))
