"""Codebooks for a standard normal N(0, 1): the levels octave codes index.

LEVELS are the Lloyd-Max levels moved to a 7-bit integer grid: level = (u - 63.5) x STEP[bits], u = GRID[bits]
an integer in 0..127, so a kernel can score K with an int8 dot whose products are exact (kernels/decode_mma.py,
"int8 scores"). Each level is the grid point nearest to its Lloyd-Max level (`LLOYD_MAX`: the fixed point of the
Lloyd-Max iteration run by `derive_levels`, float64, symmetric), with the step that gives the least squared
error over N(0, 1) (`derive_grid`): the grid costs +0.026 % (3-bit) and +0.34 % (4-bit) of mean squared error
and moves no level by more than 0.018. `tests/kvformats/test_codebook.py` re-derives both. Code c in
[0, 2**bits) means LEVELS[bits][c]; levels ascend, so the code's top bit is the sign (1 = positive).
"""

from __future__ import annotations

import math

_POS_3BIT = (0.2450941789442233, 0.7560052812058812, 1.3439092785050057, 2.151945704536996)
_POS_4BIT = (
    0.12839502985114712, 0.38804829949029046, 0.6567591185324636, 0.9423404564869614,
    1.2562311973471765, 1.6180463860218819, 2.0690172265313955, 2.73258957099515,
)


def _mirror(pos: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(-v for v in reversed(pos)) + tuple(pos)


LLOYD_MAX: dict[int, tuple[float, ...]] = {3: _mirror(_POS_3BIT), 4: _mirror(_POS_4BIT)}

GRID_OFFSET = 63.5  # level = (u - GRID_OFFSET) x step; u(-L) = 127 - u(L)
STEP = {3: 0.03680006950697857, 4: 0.051119414329993305}
GRID: dict[int, tuple[int, ...]] = {
    3: (5, 27, 43, 57, 70, 84, 100, 122),
    4: (10, 23, 32, 39, 45, 51, 56, 61, 66, 71, 76, 82, 88, 95, 104, 117),
}
LEVELS: dict[int, tuple[float, ...]] = {bits: tuple((u - GRID_OFFSET) * STEP[bits] for u in GRID[bits]) for bits in GRID}
# Part of the stored pages' meaning: pages of another codebook revision must not be read as these (the HiCache
# storage tier keys pages by it). 1: the Lloyd-Max levels; 2: on the 7-bit grid.
REVISION = 2


def thresholds(bits: int) -> tuple[float, ...]:
    """Decision thresholds (midpoints between neighbouring levels), ascending; len = 2**bits - 1.

    The code of a normalized value t is the number of thresholds m with t > m (a tie goes to the lower code).
    """
    lv = LEVELS[bits]
    return tuple((lv[i] + lv[i + 1]) * 0.5 for i in range(len(lv) - 1))


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) if math.isfinite(x) else 0.0


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def derive_levels(bits: int, iterations: int = 20000) -> tuple[float, ...]:
    """Lloyd-Max iteration for N(0,1), positive half only (the density is symmetric).

    Start: levels evenly spaced on (0, 3]. Step: thresholds = midpoints (0 below the first level, +inf above
    the last); each level = E[X | X in its cell] = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)). Stops when no level
    moves by more than 1e-15 or after `iterations` steps.
    """
    half = 2 ** (bits - 1)
    pos = [3.0 * (k + 1) / half for k in range(half)]
    for _ in range(iterations):
        edges = [0.0] + [(pos[k] + pos[k + 1]) * 0.5 for k in range(half - 1)] + [math.inf]
        new = [
            (_pdf(edges[k]) - _pdf(edges[k + 1])) / ((1.0 if edges[k + 1] == math.inf else _cdf(edges[k + 1])) - _cdf(edges[k]))
            for k in range(half)
        ]
        moved = max(abs(a - b) for a, b in zip(new, pos))
        pos = new
        if moved < 1e-15:
            break
    return _mirror(tuple(pos))


def quantizer_mse(levels: tuple[float, ...]) -> float:
    """E[(X - Q(X))^2] for X ~ N(0, 1), Q: the nearest of `levels` (ascending; thresholds at midpoints)."""
    edges = [-math.inf] + [(a + b) * 0.5 for a, b in zip(levels, levels[1:])] + [math.inf]
    total = 0.0
    for level, a, b in zip(levels, edges, edges[1:]):
        p = _cdf(b) - _cdf(a)
        m1 = _pdf(a) - _pdf(b)  # integral of x pdf(x) over (a, b)
        m2 = p - ((b * _pdf(b) if math.isfinite(b) else 0.0) - (a * _pdf(a) if math.isfinite(a) else 0.0))
        total += m2 - 2.0 * level * m1 + level * level * p
    return total


def derive_grid(bits: int, steps: int = 20000) -> tuple[float, tuple[int, ...]]:
    """(step, u per code): LLOYD_MAX[bits] rounded to the grid (u - GRID_OFFSET) x step, over the steps
    top / (63.5 - 33.5 i / steps) (the top level at u 127 down to 97), the one with the least quantizer_mse."""
    lloyd = LLOYD_MAX[bits]
    top = max(abs(x) for x in lloyd)
    best = None
    for i in range(steps + 1):
        step = top / (GRID_OFFSET - 33.5 * i / steps)
        u = tuple(round(GRID_OFFSET + x / step) for x in lloyd)
        mse = quantizer_mse(tuple((k - GRID_OFFSET) * step for k in u))
        if best is None or mse < best[0]:
            best = (mse, step, u)
    return best[1], best[2]
