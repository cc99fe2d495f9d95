"""Launch tuning of the kernels: every measured launch choice in one module, keyed by (architecture, format,
head_dim), each entry naming the result files (under docs/benchmarks/) it was chosen from.

An entry applies only on the architectures it was measured for; elsewhere the launchers keep their portable
defaults (decode.decode_attention's docstring). Architecture keys, most specific first (`arch_keys`):
- SM90: compiled on an NVIDIA GPU of compute capability 9.x or later (every entry was measured on an H200);
- NVIDIA: compiled on any NVIDIA GPU (where the Gluon stage 1 or the PTX conversions run at all);
- ANY: every device, the Triton interpreter included.
Timings quoted with an entry are batch 8 x 32k on an H200 unless stated; the current decode table is
docs/benchmarks/kernels.md, "Decode at the byte limit". The launchers and planners (decode, decode_plan,
decode_mma, store, extend) take their tuned values from here only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kvformats import FORMAT_NAMES, SUPPORTED_HEAD_DIMS
from .device import DeviceInfo

SM90, NVIDIA, ANY = "sm90", "nvidia", "any"


@dataclass(frozen=True)
class Tuned:
    value: object
    # the result files under docs/benchmarks/ the value was chosen from (tests/kernels/test_launch_table.py checks
    # that they exist)
    sources: tuple[str, ...]


def arch_keys(info: DeviceInfo) -> tuple[str, ...]:
    """The architecture keys that apply to the device, most specific first."""
    if info.at_least(9):
        return SM90, NVIDIA, ANY
    return (NVIDIA, ANY) if info.nvidia else (ANY,)


def lookup(table: dict, info: DeviceInfo, fmt_name: str, head_dim: int, default=None):
    """The value of the most specific entry of `table` for (an architecture of `info`, fmt_name, head_dim)."""
    for arch in arch_keys(info):
        entry = table.get((arch, fmt_name, head_dim))
        if entry is not None:
            return entry.value
    return default


def at(table: dict, arch: str, fmt_name: str, head_dim: int, default=None):
    """The value of `table`'s entry for exactly this architecture key, or default."""
    entry = table.get((arch, fmt_name, head_dim))
    return default if entry is None else entry.value


# the rules that hold wherever their table's entries apply (not per format): name -> result files
SCALAR_SOURCES: dict[str, tuple[str, ...]] = {}


def _rule(name: str, value: int, *sources: str) -> int:
    SCALAR_SOURCES[name] = sources
    return value


def _each(arch: str, formats: tuple[str, ...], head_dims: tuple[int, ...], value, *sources: str) -> dict:
    return {(arch, f, d): Tuned(value, sources) for f in formats for d in head_dims}


OCTAVE = ("octave_k3v4", "octave_k3v3")

# --- the Triton stage 1 (decode._decode_stage1) ---------------------------------------------------------------------

# Tokens per loop iteration, where no launch below gives one (other: 64).
TRITON_BLOCK_N = {
    **_each(ANY, ("bf16",), (128, 256), 64, "kernels-variants-1.json", "kernels-variants-2.json"),
    **_each(ANY, ("int8",) + OCTAVE, (128, 256), 128, "kernels-variants-1.json", "kernels-variants-2.json"),
}

# The launch for one request token (q_len 1) and GQA groups of at most 8 query heads: K/V as the dots' first operand,
# warps, tokens per iteration, query rows at least, pipelining depth. Against the earlier launch (4 warps, 16 rows,
# K/V second): int8 d128 208 -> 168 us, d256 200 -> 174; octave_k3v4 d128 295 -> 263, d256 406 -> 371; octave_k3v3
# d128 285 -> 228, d256 404 -> 373. int8 prefetches one tile ahead (num_stages 2) rather than Triton's default
# two: d128 160 -> 154 us, d256 169 -> 166 (octave lost with it). Not measured elsewhere (other GPUs, larger groups,
# verify steps, bf16 planes): there the earlier launch.
_R11 = ("kernels-r11-kv-a.json", "kernels-r11-final-b8.json")
_R12 = ("kernels-r12-launches.json", "kernels-r12-final-b8.json")
TRITON_LAUNCH = {
    **_each(SM90, ("int8",), (128,), {"kv_a": True, "num_warps": 1, "block_n": 64, "min_rows": 8, "num_stages": 2},
            *_R11, *_R12),
    **_each(SM90, ("int8",), (256,), {"kv_a": True, "num_warps": 2, "block_n": 64, "min_rows": 8, "num_stages": 2},
            *_R11, *_R12),
    **_each(SM90, ("octave_k3v4",), (128, 256), {"kv_a": False, "num_warps": 4, "block_n": 128, "min_rows": 8},
            *_R11),
    **_each(SM90, ("octave_k3v3",), (128,), {"kv_a": True, "num_warps": 1, "block_n": 64, "min_rows": 8}, *_R11),
    **_each(SM90, ("octave_k3v3",), (256,), {"kv_a": True, "num_warps": 4, "block_n": 128, "min_rows": 8}, *_R11),
}
# With 1-2 warps a program a small batch leaves SMs idle: at batch 1 x 128k (8 KV heads x 16 splits = 128 programs
# of 1 warp on 132 SMs) the int8 d128 entry took 286 us against 234 with 4 warps, octave_k3v3 d128 534 against 279.
# Where a grid cannot bring this many warps per SM, a TRITON_LAUNCH entry runs with 4 warps, 128 tokens per
# iteration and Triton's default pipelining depth.
LAUNCH_MIN_WARPS_PER_SM = _rule("LAUNCH_MIN_WARPS_PER_SM", 4, "kernels-r11-b1.json", "kernels-r11-b4.json",
                                "kernels-r11-final-b1.json")

# Registers per thread at most for octave decode (q_len 1, 16-row dots): ptxas's own choice (156-168) fits 3
# programs per SM, 128 fits 4 for 4 spilled words per iteration. d128 k3v4 315 -> 296 us, k3v3 304 -> 285, d256
# k3v4 456 -> 406, k3v3 412 -> 405; 96 (5 programs, more spills) and int8 at 128 were slower.
OCTAVE_MAXNREG = _each(SM90, OCTAVE, (128, 256), 128, "kernels-alternate-r10-1.json", "kernels-alternate-r10-2.json")

# int8 codes to fp16 dot operands (decode.I8_F16_V: only V converted before the shared-memory trip, K after it in
# the operand layout; 1 = decode.I8_F16_BOTH, both before): d128 237 -> 210 us, d256 229 -> 201, alternated 9
# times in each of two processes. Other head_dims: both before the trip.
INT8_F16_MODE = _each(NVIDIA, ("int8",), (128, 256), 2, "kernels-alternate-1.json", "kernels-alternate-2.json")

# Fixed cost of a stage-1 program in loop iterations (loading q, the first tile's latency, storing its partial
# output; stage 2 reads one partial per split), in decode.wave_splits' model: with it a tie between waves x
# iterations goes to fewer splits. 1-3 gave the same choices within 1 % on the grid, and at batch 32 x 4k fewer
# splits than 0, 4-12 % faster.
SPLIT_OVERHEAD_ITERS = _rule("SPLIT_OVERHEAD_ITERS", 2, "kernels-r13-splits.json", "kernels-r13-splits-verify.json")

# --- the store kernel (store.store_kv) -----------------------------------------------------------------------------

# (tokens per program, warps), where the default (16, 4) was beaten: octave stores one warp of 8 tokens, since with 4
# warps the rotation's reductions cross warps through shared memory and barriers (4096 tokens, d128: 406 us at
# 16 x 4, 118 us at 16 x 1, 65 us at 8 x 1).
STORE_LAUNCH = _each(ANY, OCTAVE, SUPPORTED_HEAD_DIMS, (8, 1), "kernels-store-run6.json")

# --- extend (extend.extend_attention) ------------------------------------------------------------------------------

# (query token, q head) rows per program (the accumulators are rows x head_dim float32) and prefix tokens per
# iteration, every format: measured at 4096 new tokens over a 32k prefix, batch 1.
_V12 = ("kernels-variants-1.json", "kernels-variants-2.json")
EXTEND_LAUNCH = {
    **_each(ANY, FORMAT_NAMES, (64, 128), {"rows_per_program": 256, "block_n": 64}, *_V12),
    **_each(ANY, FORMAT_NAMES, (256,), {"rows_per_program": 128, "block_n": 32}, *_V12),
}

# --- the Gluon stage 1 (decode_mma) ---------------------------------------------------------------------------------

# Where the planner takes it by default: where it was measured faster than the Triton stage 1 (on sm_80 / sm_86 it
# compiles but was not run: stage1="mma" asks for it there).
MMA_DEFAULT = {
    **_each(SM90, OCTAVE, (128, 256), True, "kernels-r16-grid.json"),
    **_each(SM90, ("int8",), (128, 256), True, "kernels-r16-grid-int8.json"),
}
# Where MMA_DEFAULT has int8, it takes the Gluon kernel only for requests of at least this mean length
# (decode_plan: an eager-only rule): it was faster at every 32k and 128k shape of the grid (batch 8 x 32k d256:
# 164 -> 151 us; batch 1 x 128k: 174 -> 83 at d128, 256 -> 113 at d256), but at 4k slower in 3 of 6 (batch 8 d256
# 36 -> 43 us).
MMA_INT8_MIN_TOKENS = _rule("MMA_INT8_MIN_TOKENS", 8192, "kernels-r16-grid-int8.json",
                            "kernels-r16-int8-alternate.json")

# Tokens per loop iteration: d128 32 took 166 us, 16 took 243 and 64 took 175; d256 32 took 171, 16 took 166 (and
# at batch 1 x 128k 116 against 123); with 3-bit V, d128 32 took 170 and 16 took 169, d256 32 took 168 and 16 took
# 162 (at 32 the loop spills a few registers). int8: d128 32 148 us against 16 179; d256 16 152 against 32 204.
MMA_BLOCK_N = {
    **_each(NVIDIA, OCTAVE, (128,), 32, "kernels-r16-alternate.json", "kernels-r16-b1-block-n.json"),
    **_each(NVIDIA, OCTAVE, (256,), 16, "kernels-r16-alternate.json", "kernels-r16-b1-block-n.json"),
    **_each(NVIDIA, ("int8",), (64, 128), 32, "kernels-r16-int8-alternate.json"),
    **_each(NVIDIA, ("int8",), (256,), 16, "kernels-r16-int8-alternate.json"),
}
# The octave kernel's options when the caller does not choose. Int8 scores (mma_octave's docstring; the error of
# bf16 scores or less) at d128, where every shape of the grid ran faster (k3v4 139 -> 132 us, k3v3 144 -> 137); not
# at d256: faster from batch 8 x 32k up (141 against 144 us) but slower at batch 1 (32k: 50 against 42) and at 4k,
# their four q blocks' operands at 255 registers.
MMA_QK8 = _each(NVIDIA, OCTAVE, (128,), True, "kernels-r20-alt.json", "kernels-r20-final-alt.json")
# The lazy rescale (exact arithmetic), with bf16 scores: d128 and d256 k3v4.
MMA_LAZY = {
    **_each(NVIDIA, OCTAVE, (128,), True, "kernels-r19-variants-alt.json", "kernels-r19-bf16-lazy-alt.json"),
    **_each(NVIDIA, ("octave_k3v4",), (256,), True, "kernels-r19-variants-alt.json",
            "kernels-r19-bf16-lazy-alt.json"),
}
# ... and with int8 scores: at d256 it spills (149 against 141 us eager), hence d128 only.
MMA_LAZY_QK8 = _each(NVIDIA, OCTAVE, (128,), True, "kernels-r19-q8-alt.json", "kernels-r20-final-alt.json")

# Split counts when the launcher chooses (one-warp programs, latency-bound: more resident warps per SM run faster):
# - long requests (MMA_LONG_CONTEXT tokens or more) fill every resident program slot: batch 1 x 128k took 419 us
#   with 16 splits, 128 with 64, 95-100 with 128;
# - short ones aim at MMA_SHORT_PROGRAMS_PER_SM programs per SM, since stage 2's merge and each program's fixed
#   cost grow with the count: batch 1 x 4k took 32 us with 16 splits, 28 with 32 or 64, 33 with 128; batch 8 x 4k
#   45 with 16, 53 with 32, 66 with 64;
# - at least MMA_MIN_SPLIT_TOKENS tokens a split, at most MMA_MAX_SPLITS splits.
_R15 = "kernels-r15-alternate.json"
MMA_MAX_SPLITS = _rule("MMA_MAX_SPLITS", 128, _R15)
MMA_MIN_SPLIT_TOKENS = _rule("MMA_MIN_SPLIT_TOKENS", 64, _R15)
MMA_LONG_CONTEXT = _rule("MMA_LONG_CONTEXT", 16384, _R15)
MMA_SHORT_PROGRAMS_PER_SM = _rule("MMA_SHORT_PROGRAMS_PER_SM", 4, _R15)

TABLES = {"TRITON_BLOCK_N": TRITON_BLOCK_N, "TRITON_LAUNCH": TRITON_LAUNCH, "OCTAVE_MAXNREG": OCTAVE_MAXNREG,
          "INT8_F16_MODE": INT8_F16_MODE, "STORE_LAUNCH": STORE_LAUNCH, "EXTEND_LAUNCH": EXTEND_LAUNCH, "MMA_DEFAULT": MMA_DEFAULT, "MMA_BLOCK_N": MMA_BLOCK_N, "MMA_QK8": MMA_QK8,
          "MMA_LAZY": MMA_LAZY, "MMA_LAZY_QK8": MMA_LAZY_QK8}


def all_sources() -> dict[str, tuple[str, ...]]:
    """Every entry and rule by a readable name -> its result files (for the check that they exist)."""
    out = dict(SCALAR_SOURCES)
    for name, table in TABLES.items():
        out.update({f"{name}{key}": entry.sources for key, entry in table.items()})
    return out
