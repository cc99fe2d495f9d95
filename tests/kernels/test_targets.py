"""The ahead-of-time compile command, on a sample of variants (the full run, all kernels x 4 targets, takes
minutes; it is run by hand and its table is in docs/formats.md)."""

import os
import subprocess
import sys


def test_targets_command_compiles_for_all_four_targets():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "sglang_ext.kernels.targets", "--group", "sglang-ext", "--only",
                          "decode_stage1 octave_k3v3 d128"], env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    for target in ("cuda:80", "cuda:86", "cuda:90", "hip:gfx1100"):
        assert f"{target}" in out.stdout and "FAIL" not in out.stdout, out.stdout
    assert "decode_stage1 octave_k3v3 d128 verify q_len 4" in out.stdout  # the chain-verify variant too
    assert "decode_stage1 octave_k3v3 d128 verify q_len 4 tree" in out.stdout  # the tree-verify variant
    assert "decode_stage1 octave_k3v3 d128 launch" in out.stdout  # and decode.DEFAULT_LAUNCH's launch
    assert "16 compiled, 0 failed" in out.stdout  # 4 variants x 4 targets


def test_targets_command_builds_the_gluon_decode_for_nvidia_only():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "sglang_ext.kernels.targets", "--group", "sglang-ext", "--only",
                          "decode_stage1_mma"], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "72 compiled, 0 failed" in out.stdout, out.stdout  # 24 variants x sm_80 / 86 / 90
    assert "hip:gfx1100  skipped (built for cuda only)" in out.stdout, out.stdout


def test_importing_the_command_does_not_import_sglang():
    """Core never imports SGLang: its group is loaded only when the command runs it."""
    script = "import sys, sglang_ext.kernels.targets; print(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'))"
    out = subprocess.run([sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_targets_command_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "sglang_ext.kernels.targets", "--only", "nothing"], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "TRITON_INTERPRET" in out.stderr
