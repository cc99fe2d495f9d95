"""kernels/launch_table: every entry names result files that exist, and an entry applies only on the architectures
it was measured for."""

from pathlib import Path

from sglang_ext.kernels import launch_table as t
from sglang_ext.kernels.device import CPU, DeviceInfo

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
H200 = DeviceInfo(vendor="cuda", interpreted=False, capability=(9, 0), sms=132)
A3090 = DeviceInfo(vendor="cuda", interpreted=False, capability=(8, 6), sms=82)
RDNA3 = DeviceInfo(vendor="hip", interpreted=False, sms=48)
INTERPRETED_GPU = DeviceInfo(vendor="cuda", interpreted=True, capability=(9, 0), sms=132)


def test_every_entry_names_result_files_that_exist():
    sources = t.all_sources()
    assert len(sources) > 40, len(sources)  # every table and rule is listed
    missing = {name: f for name, files in sources.items() for f in files if not (RESULTS / f).is_file()}
    assert not missing, f"entries citing result files that are not in docs/benchmarks/: {missing}"
    assert all(files for files in sources.values()), [n for n, f in sources.items() if not f]


def test_architecture_keys_most_specific_first():
    assert t.arch_keys(H200) == (t.SM90, t.NVIDIA, t.ANY)
    assert t.arch_keys(A3090) == (t.NVIDIA, t.ANY)
    for info in (RDNA3, CPU, INTERPRETED_GPU):
        assert t.arch_keys(info) == (t.ANY,)


def test_entries_apply_only_where_measured():
    assert t.lookup(t.MMA_DEFAULT, H200, "octave_k3v4", 128) is True
    assert t.lookup(t.MMA_DEFAULT, A3090, "octave_k3v4", 128, False) is False  # compiles there, not measured
    assert t.lookup(t.MMA_DEFAULT, H200, "int8", 64, False) is False  # int8 d64: Gluon only when asked
    assert t.lookup(t.MMA_BLOCK_N, A3090, "octave_k3v3", 256) == 16  # where stage1="mma" is asked
    assert t.lookup(t.TRITON_LAUNCH, RDNA3, "int8", 128) is None
    assert t.lookup(t.TRITON_BLOCK_N, CPU, "octave_k3v4", 256) == 128  # tile sizes hold everywhere
    assert t.at(t.STORE_LAUNCH, t.ANY, "octave_k3v3", 64) == (8, 1)
    assert t.at(t.STORE_LAUNCH, t.ANY, "int8", 128, (16, 4)) == (16, 4)
