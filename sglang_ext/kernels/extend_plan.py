"""Extend (prefill) attention, planned once per batch and run per layer (as decode_plan is for decode).

`plan_extend` makes the launch decisions of one batch's extend from what is known once per batch: the format, the
head layout, the device's facts, and two lengths from the caller's host metadata: `prefix_rows`, the batch's total
cached-prefix length (the sum of SGLang's extend_prefix_lens_cpu, i.e. kv_indptr[B]), and `max_len_extend`, the
longest request's new-token count. Never a buffer's size: SGLang allocates kv_indices to batch x context length
when it lacks the host prefix lengths, and under CUDA graphs kv_indices is the whole preallocated buffer (max batch
x context length), so a rule reading kv_indices.shape[0] sized the prefix scratch, and took the decision, from a
number unrelated to the batch. `prefix_rows=None` means the lengths are not known when the plan is made (a
CUDA-graph capture, whose plan holds for every replay, or metadata without host lengths): then the direct kernel
runs, which needs no buffer sized by a length.

Prefix scratch (extend.py's docstring says what it is): for int8 / octave (SCRATCH_KINDS), never for a verify with
a custom mask, only when a request may span >= SCRATCH_MIN_QUERY_BLOCKS query blocks, and within SCRATCH_BYTES
(prefix_rows x KV heads x head_dim for K and V); above the budget the KV heads are taken in chunks, and if one KV
head's prefix alone exceeds it, the direct kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from ..kvformats import KVFormat
from . import launch_table, tables
from .decode import layout, use_bf16_dots
from .device import DeviceInfo, device_info

# 256 MiB: the bf16 K+V of a 32k-token prefix at 8 KV heads x d128 (or 4 x d256) is 128 MiB, so the benchmark's
# 32k shape fits whole and a 64k prefix still runs as one chunk; it is one transient, reused layer after layer by
# the caching allocator, below a prefill's own activations at SGLang's default chunked-prefill size (e.g. an
# 8k-token MLP intermediate of a 70B model is ~470 MB), and 0.2 % of an H200's memory. Larger prefixes are taken a
# few KV heads at a time.
SCRATCH_KINDS = (tables.FMT_INT8, tables.FMT_OCTAVE)
SCRATCH_BYTES = 256 << 20
SCRATCH_MIN_QUERY_BLOCKS = 2


def default_launch(fmt_name: str, head_dim: int) -> dict:
    """{"rows_per_program", "block_n"}: launch_table.EXTEND_LAUNCH's entry (every format and supported head_dim)."""
    return launch_table.at(launch_table.EXTEND_LAUNCH, launch_table.ANY, fmt_name, head_dim)


def scratch_plan(kind: int, prefix_rows: int | None, h_kv: int, head_dim: int, max_len_extend: int, block_m: int,
                 elem_bytes: int, verify: bool, force: bool | None = None,
                 budget: int | None = None) -> list[tuple[int, int]] | None:
    """KV-head ranges [(h0, h1), ...] to run through the prefix scratch one after the other, or None for the
    direct kernel (module docstring). prefix_rows: the batch's total prefix length from host lengths, None when
    unknown (the direct kernel); elem_bytes: 2 (bf16) or 4 (float32). force: None = the rule; True = the scratch
    wherever it is allowed (compressed format, not verify, a known non-empty prefix, within the budget) whatever
    the query-block count; False = the direct kernel."""
    budget = SCRATCH_BYTES if budget is None else budget
    if force is False or verify or kind not in SCRATCH_KINDS or not prefix_rows:
        return None
    if force is None and triton.cdiv(max(int(max_len_extend), 1), block_m) < SCRATCH_MIN_QUERY_BLOCKS:
        return None
    per_head = prefix_rows * head_dim * elem_bytes * 2  # K and V
    heads = min(h_kv, budget // per_head)
    if heads == 0:
        return None
    return [(h0, min(h0 + heads, h_kv)) for h0 in range(0, h_kv, heads)]


@dataclass(frozen=True)
class ExtendPlan:
    """The launch decisions of one batch's extend attention (same for all its layers)."""

    fmt_name: str
    head_dim: int
    num_q_heads: int
    num_kv_heads: int
    prefix_rows: int | None  # the batch's total prefix tokens (kv_indptr[B]) from host lengths; None: unknown
    max_len_extend: int  # the longest request's new tokens (the query-block grid)
    block_m: int  # new tokens per program
    dot_bf16: bool  # 16-bit dot operands; the scratch holds bf16 then, else float32
    # KV-head ranges run through the prefix scratch (rows = prefix_rows), or None: the direct kernel
    scratch: tuple[tuple[int, int], ...] | None

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


def plan_extend(fmt: KVFormat, num_kv_heads: int, *, num_q_heads: int, prefix_rows: int | None,
                max_len_extend: int, verify: bool, info: DeviceInfo | str, block_m: int | None = None,
                dot_bf16: bool | None = None, prefix_scratch: bool | None = None,
                scratch_bytes: int | None = None) -> ExtendPlan:
    """The plan of a batch's extend attention over a pool of num_kv_heads KV heads of fmt.head_dim. verify: the
    extend applies a custom (draft-tree) mask (the direct path). info: the device's facts, or the device.
    block_m (None: default_launch's rows_per_program / the group size rounded up to a power of 2), dot_bf16 (None:
    on a compiled GPU), prefix_scratch (None: the rule; True: the scratch wherever allowed, raising where it is
    not; False: the direct kernel) and scratch_bytes (None: SCRATCH_BYTES): overrides for tests and benchmarks."""
    info = info if isinstance(info, DeviceInfo) else device_info(info)
    d = fmt.head_dim
    assert num_q_heads % num_kv_heads == 0, f"q heads {num_q_heads} not a multiple of kv heads {num_kv_heads}"
    assert prefix_rows is None or prefix_rows >= 0, prefix_rows
    group = num_q_heads // num_kv_heads
    if block_m is None:
        block_m = max(1, default_launch(fmt.name, d)["rows_per_program"] // triton.next_power_of_2(group))
    bf16_dots = use_bf16_dots(info, dot_bf16)
    kind = layout(fmt)[0]
    scratch = scratch_plan(kind, prefix_rows, num_kv_heads, d, max_len_extend, block_m, 2 if bf16_dots else 4,
                           verify, prefix_scratch, scratch_bytes)
    if prefix_scratch:
        assert scratch is not None, ("prefix_scratch=True: not allowed here (format, verify, unknown or empty "
                                     "prefix, or budget)")
    return ExtendPlan(fmt_name=fmt.name, head_dim=d, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                      prefix_rows=prefix_rows, max_len_extend=int(max_len_extend), block_m=block_m,
                      dot_bf16=bf16_dots, scratch=None if scratch is None else tuple(scratch))
