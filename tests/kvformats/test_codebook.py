import itertools

from sglang_ext.kvformats.codebook import (GRID, GRID_OFFSET, LEVELS, LLOYD_MAX, STEP, derive_grid, derive_levels,
                                           quantizer_mse, thresholds)


def test_hard_coded_levels_are_the_lloyd_max_fixed_point():
    for bits in (3, 4):
        derived = derive_levels(bits)
        assert len(LLOYD_MAX[bits]) == 2 ** bits
        worst = max(abs(a - b) for a, b in zip(derived, LLOYD_MAX[bits]))
        assert worst < 1e-12, f"{bits}-bit levels differ from the re-derived ones by {worst}"


def test_levels_are_the_lloyd_max_levels_on_the_7_bit_grid():
    for bits, mse_bound in ((3, 1.001), (4, 1.005)):
        step, u = derive_grid(bits)
        assert u == GRID[bits] and abs(step - STEP[bits]) < 1e-15, (step, u)
        assert all(0 <= k <= 127 for k in u) and all(a + b == 127 for a, b in zip(u, reversed(u)))
        assert LEVELS[bits] == tuple((k - GRID_OFFSET) * step for k in u)
        assert max(abs(a - b) for a, b in zip(LEVELS[bits], LLOYD_MAX[bits])) < 0.018
        # the grid's price: +0.026 % (3-bit) and +0.34 % (4-bit) mean squared error over N(0, 1)
        assert quantizer_mse(LLOYD_MAX[bits]) < quantizer_mse(LEVELS[bits]) < mse_bound * quantizer_mse(LLOYD_MAX[bits])


def test_quantizer_mse_known_values():
    # Max (1960): 0.03455 (3-bit), 0.009497 (4-bit) for N(0, 1)
    assert abs(quantizer_mse(LLOYD_MAX[3]) - 0.03455) < 2e-5 and abs(quantizer_mse(LLOYD_MAX[4]) - 0.009497) < 1e-5


def test_levels_known_values_symmetric_and_ascending():
    # Max (1960) tables: 3-bit outermost 2.152, 4-bit outermost 2.733
    assert abs(LLOYD_MAX[3][-1] - 2.1520) < 1e-3 and abs(LLOYD_MAX[4][-1] - 2.7326) < 1e-3
    for bits in (3, 4):
        for lv in (LEVELS[bits], LLOYD_MAX[bits]):
            assert all(a < b for a, b in itertools.pairwise(lv))
            assert all(a == -b for a, b in zip(lv, reversed(lv)))
        th = thresholds(bits)
        assert len(th) == 2 ** bits - 1 and th[len(th) // 2] == 0.0
