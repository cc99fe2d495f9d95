"""decode.wave_splits: the split count that the waves x loop-iterations model prefers; decode.default_maxnreg and
decode.default_launch: where the measured launches apply."""

import math
from types import SimpleNamespace

from sglang_ext.kernels.decode import resident_programs, wave_splits
from sglang_ext.kernels.launch_table import SPLIT_OVERHEAD_ITERS
from sglang_ext.kernels.device import CPU, DeviceInfo


def _cost(programs: int, s: int, slots: int, seq_len: int, block_n: int) -> int:
    per_split = math.ceil(math.ceil(seq_len / s) / 32) * 32
    return math.ceil(programs * s / slots) * (max(1, math.ceil(per_split / block_n)) + SPLIT_OVERHEAD_ITERS)


# The cases below are launches measured on an H200 (132 SMs; docs/benchmarks/kernels-r13-splits.json): (requests x
# KV heads, slots = 132 x resident programs, tokens per request, block_n).

def test_batch_8_at_32k_fills_one_wave_instead_of_a_part_empty_second():
    # octave_k3v4 d256: 8 x 4 KV heads, 3 programs per SM. 12 splits = 384 programs in one wave of 396 (measured
    # 359 us); 16 = 512, a second wave of 116 (437 us)
    assert wave_splits(32, 16, 396, 32768, 128) == 12
    # int8 d128: 8 x 8 KV heads, 8 programs per SM: 16 splits still one wave (150 us; 6 splits 176 us)
    assert wave_splits(64, 16, 1056, 32768, 64) == 16


def test_a_tie_in_waves_x_iterations_goes_to_fewer_splits():
    # int8 d128 at batch 32 x 4k: 4, 8 and 16 splits all cost 16 iterations a slot without the per-program cost;
    # measured 88 / 93 / 100 us
    assert wave_splits(256, 16, 1056, 4096, 64) == 4
    # octave_k3v4 d128 (4 programs per SM, 128 tokens): 2 splits measured 140 us, 16 151 us
    assert wave_splits(256, 16, 528, 4096, 128) == 2
    assert wave_splits(8, 16, 396, 32768, 128) == 16  # never a full wave: as many splits as allowed


def test_resident_count_decides_the_waves():
    # octave_k3v3 d128 at batch 32 x 32k, 1-warp programs: with 8 resident (the driver's count) 16 splits fill
    # 4 waves (808 us); a count of 9 chose 9 splits, 3 waves in truth (941 us)
    assert wave_splits(256, 16, 132 * 8, 32768, 64) == 16
    assert wave_splits(256, 16, 132 * 9, 32768, 64) == 9


def test_choice_is_within_five_percent_of_the_cheapest():
    for programs in (4, 8, 32, 64, 256):
        for slots in (264, 396, 660):
            for seq_len in (1, 77, 4096, 32768, 131072):
                s = wave_splits(programs, 16, slots, seq_len, 128)
                best = min(_cost(programs, t, slots, seq_len, 128) for t in range(1, 17))
                assert 1 <= s <= 16 and _cost(programs, s, slots, seq_len, 128) <= 1.05 * best


def test_resident_programs_without_a_driver_count_registers_per_scheduler(monkeypatch):
    """Where no CUDA driver answers (HIP), the formula: each of an SM's 4 schedulers owns a quarter of the
    register file. 224 registers a thread = 7,168 a warp: 9 warps by the SM's 65,536, 2 by a quarter's 16,384."""
    import torch

    monkeypatch.setattr(torch.version, "hip", "6.0")
    props = SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                            max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)

    def kernel(n_regs, warps, shared):
        return SimpleNamespace(_init_handles=lambda: None, n_regs=n_regs, function=0,
                               metadata=SimpleNamespace(num_warps=warps, shared=shared))

    assert resident_programs(kernel(224, 1, 8192), "cuda:0") == 8
    assert resident_programs(kernel(224, 4, 8192), "cuda:0") == 2
    assert resident_programs(kernel(128, 4, 41000), "cuda:0") == 4  # 4 warps a quarter; shared memory allows 5
    assert resident_programs(kernel(64, 4, 100000), "cuda:0") == 2  # shared memory
    assert resident_programs(kernel(32, 1, 0), "cuda:0") == 32  # at most 32 programs


H200 = DeviceInfo(vendor="cuda", interpreted=False, capability=(9, 0), sms=132)
A3090 = DeviceInfo(vendor="cuda", interpreted=False, capability=(8, 6), sms=82)
RDNA3 = DeviceInfo(vendor="hip", interpreted=False, sms=48)
INTERPRETED_GPU = DeviceInfo(vendor="cuda", interpreted=True, capability=(9, 0), sms=132)


def test_register_cap_only_where_it_was_measured():
    from sglang_ext.kernels import decode

    octave, int8 = "octave_k3v4", "int8"
    assert decode.default_maxnreg(octave, 16, 1, 128, H200) == 128
    assert decode.default_maxnreg("octave_k3v3", 16, 1, 256, H200) == 128
    assert decode.default_maxnreg("bf16", 16, 1, 128, H200) is None
    assert decode.default_maxnreg(int8, 16, 1, 128, H200) is None  # int8 measured slower with the cap
    assert decode.default_maxnreg(octave, 32, 4, 128, H200) is None  # chain verify: not measured
    assert decode.default_maxnreg(octave, 16, 4, 128, H200) is None
    assert decode.default_maxnreg(octave, 16, 1, 64, H200) is None
    assert decode.default_maxnreg(octave, 16, 1, 128, CPU) is None  # CPU tensors
    assert decode.default_maxnreg(octave, 16, 1, 128, INTERPRETED_GPU) is None
    assert decode.default_maxnreg(octave, 16, 1, 128, A3090) is None  # before sm_90: not measured
    assert decode.default_maxnreg(octave, 16, 1, 128, RDNA3) is None  # maxnreg is a CUDA option


def test_launch_table_only_where_it_was_measured():
    from sglang_ext.kernels import decode, launch_table
    from sglang_ext.kvformats import get_format

    entry = launch_table.at(launch_table.TRITON_LAUNCH, launch_table.SM90, "octave_k3v3", 128)
    octave = get_format("octave_k3v3", 128)  # 1 warp a program
    full = 8 * 8 * 16  # batch 8 x 8 KV heads x 16 splits: the measured grid
    assert decode.default_launch(octave, 8, 1, H200, full) == entry and entry["num_warps"] == 1
    assert decode.default_launch(get_format("int8", 256), 4, 1, H200, 8 * 4 * 16)["kv_a"] is True
    small = decode.default_launch(octave, 8, 1, H200, 1 * 8 * 16)  # batch 1: 1 warp per SM at most
    assert small == {**entry, "num_warps": 4, "block_n": 128}
    int8 = get_format("int8", 128)  # its entry pipelines 2 deep; the small-grid launch keeps Triton's default
    assert decode.default_launch(int8, 8, 1, H200, full)["num_stages"] == 2
    assert "num_stages" not in decode.default_launch(int8, 8, 1, H200, 1 * 8 * 16)
    assert decode.default_launch(octave, 16, 1, H200, full) == {}  # groups over 8: not measured
    assert decode.default_launch(octave, 8, 4, H200, full) == {}  # chain verify: not measured
    assert decode.default_launch(get_format("bf16", 128), 8, 1, H200, full) == {}
    assert decode.default_launch(get_format("int8", 64), 8, 1, H200, full) == {}
    assert decode.default_launch(octave, 8, 1, CPU, full) == {}  # CPU tensors
    assert decode.default_launch(octave, 8, 1, INTERPRETED_GPU, full) == {}
    assert decode.default_launch(octave, 8, 1, A3090, full) == {}  # before sm_90: not measured
    assert decode.default_launch(octave, 8, 1, RDNA3, full) == {}


def test_mma_split_rule_takes_the_measured_counts():
    # decode_mma's one-warp programs on an H200: 132 SMs, 12 resident (165 registers a thread); the counts the
    # rule allows at the measured shapes (docs/benchmarks/kernels-r15-alternate.json), and wave_splits' choice
    from sglang_ext.kernels.decode import mma_max_splits
    from sglang_ext.kernels.launch_table import MMA_MAX_SPLITS

    slots, sms = 132 * 12, 132
    assert mma_max_splits(1, 8, 131072, slots, sms, 16) == MMA_MAX_SPLITS  # 128 splits: 95-100 us, 16: 419
    assert mma_max_splits(1, 8, 4096, slots, sms, 16) == 64  # 28 us with 32 or 64, 32 with 16, 33 with 128
    assert wave_splits(8, 64, slots, 4096, 32) == 64
    assert mma_max_splits(8, 8, 4096, slots, sms, 16) == 16  # 45 us with 16, 53 with 32, 66 with 64
    assert mma_max_splits(8, 8, 32768, slots, sms, 16) == 25  # fills the resident slots (24 splits: 170 us)
    assert mma_max_splits(1, 8, 100, slots, sms, 16) == 1  # at least 64 tokens a split
