"""decode.wave_splits: the split count that the waves x loop-iterations model prefers."""

import math

from sglang_ext.kernels.decode import wave_splits


def _cost(programs: int, s: int, slots: int, seq_len: int, block_n: int) -> int:
    per_split = math.ceil(math.ceil(seq_len / s) / 32) * 32
    return math.ceil(programs * s / slots) * max(1, math.ceil(per_split / block_n))


def test_batch_8_at_32k_fills_two_waves_instead_of_a_third_part_empty_one():
    # 8 requests x 8 KV heads on 132 SMs x 3 programs: 16 splits = 1024 programs = 3 waves x 16 iterations;
    # 12 splits = 2 waves x 22 iterations
    assert wave_splits(64, 16, 396, 32768, 128) == 12


def test_keeps_splits_whose_length_is_whole_iterations():
    # 15 splits of 4096 tokens = 288 tokens = 3 iterations of 128 in 10 waves; 16 splits = 2 iterations in 11
    assert wave_splits(256, 16, 396, 4096, 128) == 16
    assert wave_splits(8, 16, 396, 32768, 128) == 16  # never a full wave: as many splits as allowed


def test_choice_is_within_five_percent_of_the_cheapest():
    for programs in (4, 8, 32, 64, 256):
        for slots in (264, 396, 660):
            for seq_len in (1, 77, 4096, 32768, 131072):
                s = wave_splits(programs, 16, slots, seq_len, 128)
                best = min(_cost(programs, t, slots, seq_len, 128) for t in range(1, 17))
                assert 1 <= s <= 16 and _cost(programs, s, slots, seq_len, 128) <= 1.05 * best
