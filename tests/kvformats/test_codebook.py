import itertools

from sglang_ext.kvformats.codebook import LEVELS, derive_levels, thresholds


def test_hard_coded_levels_are_the_lloyd_max_fixed_point():
    for bits in (3, 4):
        derived = derive_levels(bits)
        assert len(LEVELS[bits]) == 2 ** bits
        worst = max(abs(a - b) for a, b in zip(derived, LEVELS[bits]))
        assert worst < 1e-12, f"{bits}-bit levels differ from the re-derived ones by {worst}"


def test_levels_known_values_symmetric_and_ascending():
    # Max (1960) tables: 3-bit outermost 2.152, 4-bit outermost 2.733
    assert abs(LEVELS[3][-1] - 2.1520) < 1e-3 and abs(LEVELS[4][-1] - 2.7326) < 1e-3
    for bits in (3, 4):
        lv = LEVELS[bits]
        assert all(a < b for a, b in itertools.pairwise(lv))
        assert all(abs(a + b) < 1e-15 for a, b in zip(lv, reversed(lv)))
        th = thresholds(bits)
        assert len(th) == 2 ** bits - 1 and th[len(th) // 2] == 0.0
