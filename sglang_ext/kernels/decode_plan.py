"""Decode attention, planned once per batch and run per layer (flashinfer's plan / run).

`plan_decode` makes every launch decision of a decode (or chain / tree verify) step from what is known once per
batch: the format, the head layout, the batch size, the step's total KV length, the device's facts
(kernels/device.py) and the caller's overrides. `decode.run_decode(plan, ...)` then launches each layer's kernels
without deciding anything: no device query, no length read from a buffer's shape, no host synchronisation.

Lengths: `seq_lens_sum` is the sum of the batch's sequence lengths as the caller's metadata knows it on the host
(SGLang's `forward_batch.seq_lens_sum`, or the sum of `seq_lens_cpu`). Never a buffer's size: under CUDA graphs the
kv_indices buffer is the whole preallocated one (max batch x context length), and eager metadata may over-allocate
it too. `seq_lens_sum=None` means the lengths are not known when the plan is made: a CUDA-graph capture, whose
plan holds for every replay of its batch-size bucket. Then every length-dependent choice takes its
long-context value, documented where it is made:
- int8 takes decode_mma's Gluon stage 1 (launch_table.MMA_INT8_MIN_TOKENS is an eager-only rule: the Gluon kernel
  won every 32k and 128k shape measured and lost 3 of 6 at 4k by up to 20 %);
- without per-request split counts from the caller, stage 1 runs max_kv_splits splits (no wave fitting).
Per-request split counts (`kv_splits_given`: SGLang's num_kv_splits, which its metadata kernels compute on the
device from the sequence lengths, at capture and at every replay) are read by the kernels, so they follow the
lengths under graphs too; the grid is sized for their maximum (max_kv_splits, times split_mul for decode_mma).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from ..kvformats import KVFormat
from . import decode as dec
from . import launch_table, tables
from .device import DeviceInfo, device_info


@dataclass(frozen=True)
class DecodeOverrides:
    """Launch knobs for benchmarks and kernel tests; None = the planner's choice. The product (the attention
    backends) passes none. stage1: "triton" (decode._decode_stage1) or "mma" (decode_mma's Gluon kernels); block_n:
    tokens per loop iteration; dot_bf16: 16-bit dot operands; num_warps / num_stages / min_rows / kv_a / maxnreg /
    lut / int8_f16: the Triton stage 1's launch (decode.decode_attention's docstring); qk8 / lazy: the Gluon octave
    kernel's int8 scores and lazy rescale; fill_waves: without caller split counts, fit the split count to the
    GPU's resident programs (wave_splits) rather than take max_kv_splits."""

    stage1: str | None = None
    block_n: int | None = None
    dot_bf16: bool | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    min_rows: int | None = None
    kv_a: bool | None = None
    maxnreg: int | None = None
    lut: int | None = None
    int8_f16: int | None = None
    qk8: bool | None = None
    lazy: bool | None = None
    fill_waves: bool = True

    def __post_init__(self):
        if self.stage1 not in (None, "triton", "mma"):
            raise ValueError(f"stage1 must be 'triton', 'mma' or None, got {self.stage1!r}")

    def triton_knobs_given(self) -> bool:
        return any(x is not None for x in (self.kv_a, self.min_rows, self.num_warps, self.num_stages, self.lut,
                                           self.int8_f16, self.maxnreg))


@dataclass(frozen=True)
class DecodePlan:
    """Every launch decision of one batch's decode attention (same for all its layers)."""

    fmt_name: str
    head_dim: int
    batch: int  # requests (a CUDA-graph bucket's size under graphs)
    q_len: int  # query tokens per request (> 1: chain / tree verify)
    num_q_heads: int
    num_kv_heads: int
    stage1: str  # "triton" or "mma"
    grid_splits: int  # stage-1 programs per (request, KV head); stage 2 merges this many partials
    split_mul: int  # decode_mma: each caller split count times this (1 elsewhere)
    # num_kv_splits: [batch] int32 per-request split counts the plan fixed (callers without their own), else None
    num_kv_splits: torch.Tensor | None
    # the Triton stage 1's constexprs and launch options (LOGIT_CAP is added per layer); {} for "mma"
    consts: dict = field(default_factory=dict)
    block_n: int = 0  # decode_mma's tokens per iteration
    qk8: bool = False
    lazy: bool = False
    tree: bool = False

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


_RESIDENT: dict[tuple, int] = {}  # stage-1 programs resident per SM, by compiled variant (wave_splits, split_mul)


def plan_decode(fmt: KVFormat, planes: dict[str, torch.Tensor], *, batch: int, num_q_heads: int,
                q_dtype: torch.dtype, seq_lens_sum: int | None, max_kv_splits: int = dec.DEFAULT_MAX_KV_SPLITS,
                q_len: int = 1, tree: bool = False, kv_splits_given: bool = False,
                index_dtype: torch.dtype = torch.int64, overrides: DecodeOverrides | None = None,
                info: DeviceInfo | None = None) -> DecodePlan:
    """The plan of a batch's decode attention over `planes` (one layer's; every layer of the pool has the same
    shapes). seq_lens_sum: the batch's total KV length known on the host, or None (a CUDA-graph capture: see the
    module docstring). kv_splits_given: the caller passes its own per-request split counts to run_decode (each <=
    max_kv_splits). tree: a draft-tree verify (q_len > 1). index_dtype: kv_indices' dtype. info: the device's facts
    (default: device_info of the planes' device; tests pass their own)."""
    ov = overrides or DecodeOverrides()
    dev = next(iter(planes.values())).device
    info = info or device_info(dev)
    h_kv = next(iter(planes.values())).shape[1]
    d = fmt.head_dim
    assert num_q_heads % h_kv == 0, f"q heads {num_q_heads} not a multiple of kv heads {h_kv}"
    assert batch >= 1 and q_len >= 1 and max_kv_splits >= 1, (batch, q_len, max_kv_splits)
    group = num_q_heads // h_kv
    assert q_len == 1 or group * q_len <= dec.MAX_VERIFY_ROWS, (group, q_len)
    assert not tree or 1 < q_len <= dec.MAX_TREE_TOKENS, (tree, q_len)
    kind, k_n4, v_n4 = dec.layout(fmt)
    mean_len = None if seq_lens_sum is None else max(1, seq_lens_sum // batch)
    base = {"fmt_name": fmt.name, "head_dim": d, "batch": batch, "q_len": q_len, "num_q_heads": num_q_heads,
            "num_kv_heads": h_kv, "tree": tree}

    if ov.stage1 == "mma" or (ov.stage1 is None and info.nvidia and ov.dot_bf16 is not False
                              and not ov.triton_knobs_given()):
        from . import decode_mma  # Gluon: imported only where it can run

        why = decode_mma.supported(fmt, group, q_len, info)
        if ov.stage1 == "mma" and why is not None:
            raise ValueError(f"stage1='mma': {why}")
        short_int8 = (kind == tables.FMT_INT8 and mean_len is not None
                      and mean_len < launch_table.MMA_INT8_MIN_TOKENS)
        if ov.stage1 == "mma" or (decode_mma.default_for(fmt, group, q_len, info) and not short_int8):
            return _plan_mma(decode_mma, fmt, planes, base, info, q_dtype, index_dtype, mean_len, max_kv_splits,
                             kv_splits_given, ov)

    launch = dec.default_launch(fmt, group, q_len, info, batch * h_kv * max_kv_splits)
    block_n = ov.block_n or launch.get("block_n") or dec.default_block_n(fmt.name, d)
    min_rows = ov.min_rows or launch.get("min_rows", 16)
    bf16_dots = dec.use_bf16_dots(info, ov.dot_bf16)
    opts = {"num_warps": ov.num_warps or launch.get("num_warps", 4)}
    num_stages = ov.num_stages or launch.get("num_stages")
    if num_stages is not None:
        opts["num_stages"] = num_stages
    block_h = max(min_rows, triton.next_power_of_2(group * q_len))
    maxnreg = ov.maxnreg
    if maxnreg is None and not info.interpreted:
        maxnreg = dec.default_maxnreg(fmt.name, block_h, q_len, d, info)
    if maxnreg:  # a register cap per thread (ptxas spills past it): more programs per SM
        opts["maxnreg"] = maxnreg
    block_n = dec.tile_tokens(kind, block_n, block_h, info)
    consts = dict(FMT=kind, GROUP=group, BLOCK_H=block_h, BLOCK_N=block_n, MIN_BLOCK=dec.MIN_BLOCK_KV, K_N4=k_n4,
                  V_N4=v_n4, NB=d // 64, DOT_BF16=bf16_dots, LUT=dec.level_decode(info, bf16_dots, ov.lut),
                  I8_F16=dec.int8_f16_dots(kind, info, d, bf16_dots, ov.int8_f16),
                  KV_A=bool(launch.get("kv_a", False) if ov.kv_a is None else ov.kv_a), Q_LEN=q_len,
                  BLOCK_T=dec.tile_tokens(kind, 16, block_h, info), TREE=tree, **opts)
    splits = None
    if not kv_splits_given:
        splits = max_kv_splits
        if ov.fill_waves and info.nvidia and mean_len is not None:
            slots = info.sms * _resident_triton(fmt, planes, consts, num_q_heads, q_dtype, index_dtype)
            splits = dec.wave_splits(batch * h_kv, max_kv_splits, slots, mean_len, block_n)
    return DecodePlan(**base, stage1="triton", grid_splits=splits or max_kv_splits, split_mul=1,
                      num_kv_splits=None if splits is None else dec.split_counts(batch, splits, dev), consts=consts)


def _plan_mma(decode_mma, fmt, planes, base: dict, info: DeviceInfo, q_dtype, index_dtype, mean_len,
              max_kv_splits: int, kv_splits_given: bool, ov: DecodeOverrides) -> DecodePlan:
    """decode_mma's plan. Split counts: with the caller's, each times split_mul, the smallest multiplier whose grid
    fills the GPU's resident one-warp programs; without, wave_splits' choice up to mma_max_splits (max_kv_splits
    when the lengths are unknown)."""
    t, d = launch_table, fmt.head_dim
    qk8 = t.lookup(t.MMA_QK8, info, fmt.name, d, False) if ov.qk8 is None else ov.qk8
    lazy = t.lookup(t.MMA_LAZY_QK8 if qk8 else t.MMA_LAZY, info, fmt.name, d, False) if ov.lazy is None else ov.lazy
    block_n = ov.block_n or t.lookup(t.MMA_BLOCK_N, info, fmt.name, d)
    batch, h_kv, group = base["batch"], base["num_kv_heads"], base["num_q_heads"] // base["num_kv_heads"]
    slots = info.sms * _resident_mma(decode_mma, fmt, planes, base["num_q_heads"], q_dtype, index_dtype, group,
                                     block_n, qk8, lazy)
    dev = next(iter(planes.values())).device
    if kv_splits_given:
        split_mul = max(1, min(launch_table.MMA_MAX_SPLITS // max_kv_splits, -(-slots // (batch * h_kv * max_kv_splits))))
        return DecodePlan(**base, stage1="mma", grid_splits=max_kv_splits * split_mul, split_mul=split_mul,
                          num_kv_splits=None, block_n=block_n, qk8=qk8, lazy=lazy)
    splits = max_kv_splits
    if ov.fill_waves and mean_len is not None:
        most = dec.mma_max_splits(batch, h_kv, mean_len, slots, info.sms, max_kv_splits)
        splits = dec.wave_splits(batch * h_kv, most, slots, mean_len, block_n)
    return DecodePlan(**base, stage1="mma", grid_splits=splits, split_mul=1,
                      num_kv_splits=dec.split_counts(batch, splits, dev), block_n=block_n, qk8=qk8, lazy=lazy)


def _resident_triton(fmt, planes, consts: dict, num_q_heads: int, q_dtype, index_dtype) -> int:
    """Resident programs per SM of the Triton stage 1 compiled with these constexprs (compiled once per variant)."""
    kc, ks, vc, vs = dec.attention_planes(fmt, planes)
    key = ("triton", kc.device.index, q_dtype, kc.dtype, ks.dtype, index_dtype, num_q_heads,
           tuple(sorted(consts.items())))
    if key not in _RESIDENT:
        dev = kc.device
        q_in = torch.empty(1, num_q_heads, fmt.head_dim, dtype=torch.float32 if fmt.rotated else q_dtype, device=dev)
        idx = torch.zeros(2, dtype=index_dtype, device=dev)
        one = torch.ones(2, dtype=torch.int32, device=dev)  # kv_indptr (int32 in SGLang), split counts, tree bits
        mid = torch.empty(1, num_q_heads, 1, fmt.head_dim, dtype=torch.float32, device=dev)
        lse = torch.empty(1, num_q_heads, 1, dtype=torch.float32, device=dev)
        kernel = dec._decode_stage1.warmup(
            q_in, kc, ks, vc, vs, one, idx, one, mid, lse, 1.0, idx, one, kc.stride(0), kc.stride(1), ks.stride(0),
            ks.stride(1), vc.stride(0), vc.stride(1), vs.stride(0), vs.stride(1), q_in.stride(0), q_in.stride(1),
            mid.stride(0), mid.stride(1), mid.stride(2), lse.stride(0), lse.stride(1), grid=(1,), LOGIT_CAP=0.0,
            **consts)
        _RESIDENT[key] = dec.resident_programs(kernel, dev)
    return _RESIDENT[key]


def _resident_mma(decode_mma, fmt, planes, num_q_heads: int, q_dtype, index_dtype, group: int, block_n: int,
                  qk8: bool, lazy: bool) -> int:
    """Resident one-warp programs per SM of decode_mma's stage 1 for this variant (compiled once)."""
    kc, ks, vc, vs = dec.attention_planes(fmt, planes)
    dev = kc.device
    key = ("mma", dev.index, fmt.head_dim, vc.shape[-1], vc.dtype, q_dtype, index_dtype, group, block_n, qk8, lazy)
    if key not in _RESIDENT:
        q = torch.empty(1, num_q_heads, fmt.head_dim, dtype=q_dtype, device=dev)
        ph = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=dev)
        one = torch.ones(1, dtype=torch.int32, device=dev)
        idx = torch.zeros(2, dtype=index_dtype, device=dev)
        kernel = decode_mma.launch_stage1(None, q, kc, ks, vc, vs, one, idx, one, ph, ph[0], 1.0, group, block_n,
                                          dec.MIN_BLOCK_KV, warmup=True, qk8=qk8, lazy=lazy)
        _RESIDENT[key] = dec.resident_programs(kernel, dev)
    return _RESIDENT[key]
