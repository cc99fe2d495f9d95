"""The GPU speculative-op install inside a CUDA / HIP SGLang process, with SGLang's real registry and helpers.

Each case runs `gpu_process_ops.py` in its own interpreter (it fakes torch's device queries for the whole process):
SGLang's `load_plugins()` loads sglang-ext and applies its hooks as on an H200 / MI300X, then SGLang's EAGLE helpers
(`build_tree_kernel_efficient`, `eagle_sample`) and the NGRAM tree reconstruction run on CPU tensors through what
was installed, compared with SGLang's own Triton versions (its XPU paths) or our torch ops. See that file's docstring.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_ext import env

SCRIPT = Path(__file__).with_name("gpu_process_ops.py")


@pytest.mark.parametrize("platform,mode,want_plan,want_checked", [
    ("cuda", "all", ["build_tree", "reconstruct", "renorm", "tree_sampling", "verify_greedy"],
     ["bindings", "build_tree", "verify_greedy", "tree_sampling+renorm", "reconstruct"]),
    # HIP's default: tree sampling only, and eagle_sample no longer verifies a sampled batch greedily
    ("hip", "auto", ["lift_hip_greedy", "tree_sampling"], ["bindings", "tree_sampling"]),
    # CUDA with FlashInfer installed (it is, here): SGLang's JIT and FlashInfer ops stay bound
    ("cuda", "auto", [], ["bindings"]),
])
def test_gpu_install_in_a_gpu_sglang_process(platform, mode, want_plan, want_checked):
    run_env = {**os.environ, "TRITON_INTERPRET": "1", env.SPEC_GPU_OPS: mode}
    run_env.pop("SGLANG_PLATFORM", None)
    done = subprocess.run([sys.executable, str(SCRIPT), platform], env=run_env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["plan"] == want_plan
    assert result["checked"] == want_checked
    # every hook sglang-ext registered was applied in that process (SGLang only logs a failed one)
    assert result["unpatched"] == [], result["unpatched"]
