"""decode.wave_splits: the split count whose stage-1 grid best fills whole waves of resident programs."""

import math

from sglang_ext.kernels.decode import wave_splits


def _fill(n: int, slots: int) -> float:
    return n / (slots * math.ceil(n / slots))


def test_fills_waves_best_and_prefers_more_splits_on_ties():
    # batch 8 x 8 KV heads on 132 SMs x 3 programs: 16 splits = 1024 programs = 2.59 waves (86 % full);
    # 12 splits = 768 = 1.94 waves (97 %), tied with 6 (384 = 0.97 of one wave): the larger count wins
    assert wave_splits(64, 16, 396) == 12
    assert wave_splits(8, 16, 396) == 16  # never a full wave: as many splits as allowed
    for programs in (1, 4, 8, 32, 64, 256):
        for slots in (132, 264, 396, 528):
            s = wave_splits(programs, 16, slots)
            assert 1 <= s <= 16
            assert all(_fill(programs * s, slots) >= _fill(programs * t, slots) - 1e-9 for t in range(1, 17))
