"""Lloyd-Max codebooks for a standard normal N(0, 1): the levels octave codes index.

The hard-coded values are the fixed point of the Lloyd-Max iteration run by `derive_levels` (float64,
symmetric: only the positive half is iterated, the negative half is its mirror, the middle threshold is 0).
`tests/kvformats/test_codebook.py` re-derives them. Code c in [0, 2**bits) means LEVELS[bits][c]; levels
ascend, so the code's top bit is the sign (1 = positive).
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


LEVELS: dict[int, tuple[float, ...]] = {3: _mirror(_POS_3BIT), 4: _mirror(_POS_4BIT)}


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
