"""Shared fixtures: the built-in model folder and a pool of real SGLang servers shared across tests."""

import os

# Triton kernels run on the CPU interpreter in CI. Set here, before any test module imports a kernel module
# (Triton picks the interpreter when a kernel is defined); servers started by tests do not inherit it.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Two pytest workers share 2 cores with the servers they start (which inherit this): OpenMP threads that spin
# while they wait lose their core to the other worker and stall each step. Measured beside the interpreter tests
# (2026-12-02): a SmolLM2 server decoded 1.15 tokens/s with the default wait policy, 6.42 with PASSIVE (6 alone).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# The repository root, so tests import the lab tooling of tools/ (not installed) as `tools.<module>`.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pytest  # noqa: E402

from server import SHARED_SERVER_ARGS, ServerPool, ServerProcess


@pytest.fixture(scope="session")
def model_dir() -> str:
    from sglang_ext.models import prepare

    return str(prepare())


@pytest.fixture(scope="session")
def server_pool(model_dir):
    pool = ServerPool(model_dir)
    yield pool
    pool.stop_all()


@pytest.fixture
def shared_server(server_pool) -> ServerProcess:
    return server_pool.get(*SHARED_SERVER_ARGS, name="shared")


# `make test` runs pytest -n 2 --dist loadfile --no-loadscope-reorder (pyproject's addopts): each file on one
# worker (its module fixtures and servers built once; each worker has its own ServerPool), files handed out in
# collection order. These files go first, longest first (seconds, one process at a time on 2 cores), so that no
# long file starts last; the rest follow in file order.
SLOW_FILES = {
    "tests/kvcache/test_triton_server.py": 1250,  # 9 servers; d128 NEXTN 585 s at load ~7, hybrid plain + tree 134 s
    "tests/kernels/test_attention.py": 981,
    "tests/hybrid/test_hybrid_kv_formats.py": 900,  # 3 per-format servers + 3 NEXTN / host-tier servers; load 8-10
    "tests/hybrid/test_hybrid_parallel.py": 722,  # 5 servers (TP2 float32, int8 TP2 + host tier, NEXTN TP2, PP3, TP2xPP2); load 4-8
    "tests/spec/test_spec_serving.py": 700,  # 8 servers; 673 s at load average 3-7
    "tests/kvcache/test_kvcache_serving.py": 559,
    "tests/hicache/test_hicache_serving.py": 414,
    "tests/kvcache/test_same_output_serving.py": 400,
    "tests/hybrid/test_hybrid_sessions.py": 370,  # one server; 327 s of it start-up at load average 15-20
    "tests/platform/test_bundle.py": 340,  # a cold bundle build, the tokenizer lookups and one server from the bundle
    "tests/hybrid/test_qwen4_exp_parallel.py": 310,  # 2 servers (PP=3 auto + SSD table, TP=2); load 8-10
    "tests/hybrid/test_hybrid_extra_buffer.py": 300,  # 2 servers (Qwen3.5, qwen4_exp); 175-328 s at load 7-12
    "tests/hybrid/test_qwen4_exp_serving.py": 300,  # 2 servers (RAM table; SSD table + NEXTN); 165 s at load 3-8
    "tests/kernels/test_store_dequant.py": 299,
    "tests/hybrid/test_hybrid_mtp.py": 274,  # 3 servers (plain, NEXTN chain + host tier + retention, tree); load 8-9
    "tests/hicache/test_hicache_tp.py": 264,  # TP=2 host tier + storage + restart; load 5-9
    "tests/sessions/test_agent_sessions.py": 264,
    "tests/test_tensor_parallel_formats.py": 250,  # 2 servers (TP=1 and TP=3, octave_k3v4); load 10-17
    "tests/tools/test_native_loop.py": 250,
    "tests/moe/test_paged_tp.py": 250,  # one tp-2 server; 187-392 s by load
    "tests/hybrid/test_qwen4_exp_kv_formats.py": 220,  # 2 servers (int8, octave_k3v4); 3 took 264-338 s at load 7-10
    "tests/moe/test_paged_serving.py": 216,  # 3 servers (K=2/4/8)
    "tests/pp/test_pp_e2e.py": 215,  # 3 servers (PP=1 and PP=3 x 2 splits, int8 KV); 211 s at load ~2
    "tests/moe/test_paged_pp.py": 165,  # one pp-2 server; load ~8
    "tests/moe/test_paged_nextn.py": 144,  # one NEXTN server; load ~10
    "tests/kvcache/test_decode_plan.py": 143,
    "tests/ple/test_gemma3n_e2e.py": 137,
    "tests/hybrid/test_hybrid_serving.py": 120,
    "tests/hicache/test_hicache_kernel_io.py": 110,
    "tests/platform/test_explicit_head_dim.py": 83,
    "tests/spec/test_spec_gpu_process.py": 70,
}


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # only on xdist's workers, whose collection order sets the schedule
        return
    rank = {path: i for i, path in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, ServerProcess):
            report.sections.append((f"server log tail ({value.name}, {value.log_path})", value.log_tail()))
