"""PP=3 on the built-in SmolLM2 (30 layers) through stock `python -m sglang.launch_server` on the CPU platform:
greedy output equals PP=1's over an int8 KV pool, with `--pp-layer-partition auto` and with an uneven explicit
split.

Needs the sglang_ext plugin to call `sglang_ext.pp.server_args.register()` and
`sglang_ext.pp.tied_lm_head.register()` (SmolLM2 ties its embeddings; see docs/pipeline-parallel.md).

Three servers (start-up is most of this file's time): one PP=1 reference and one PP=3 server per split. The split
is resolved at launch, before the KV pool exists, and the int8 pool then holds 10, 10, 10 (auto) or 8, 11, 11
layers' compressed planes on the three ranks. PP over float32 KV meets the hybrid models
(tests/hybrid/test_qwen4_exp_parallel.py).
"""

import os
import re

import pytest

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
NEW_TOKENS = 24
# float32: bf16 is emulated and slow on CPUs without native bf16; a small pool keeps start-up short.
BASE_ARGS = ("--dtype", "float32", "--max-total-tokens", "1024", "--max-running-requests", "4")
INT8_KV = ("--kv-cache-dtype", "int8")
# SGLang's CPU path binds one NUMA node per rank unless told otherwise; 3 ranks on a 1-node machine need a list.
PP3_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(rank % (os.cpu_count() or 1)) for rank in range(3))}


def _greedy(server) -> list[list[int]]:
    # One request at a time in both servers: each prompt prefills in one chunk and decodes at batch 1, so PP=1 and
    # PP=3 compute the same rows (and, over int8, store the same codes).
    return [server.generate(p, max_new_tokens=NEW_TOKENS, ignore_eos=True)["output_ids"] for p in PROMPTS]


def _assert_pp3_equals_pp1(server_pool, kv_args, partition, expected, pp1):
    args = (*BASE_ARGS, *kv_args, "--pp-size", "3", "--pp-layer-partition", partition)
    server = server_pool.get(*args, env=PP3_ENV, name=f"pp3-{partition}{'-int8' if kv_args else ''}")
    used = re.search(r"SGLANG_PP_LAYER_PARTITION=([\d,]+) \(from --pp-layer-partition\)", server.log_text())
    assert used and used.group(1) == expected, server.log_tail()
    assert server.server_info().get("pp_size") == 3
    got = _greedy(server)
    for prompt, a, b in zip(PROMPTS, got, pp1):
        first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert len(a) == len(b) == NEW_TOKENS and first_diff is None, (
            f"{prompt!r}: first difference at token {first_diff}: pp3 {a} vs pp1 {b}"
        )


@pytest.fixture(scope="module")
def pp1(server_pool):
    # Over an int8 KV pool each PP rank holds its own layers' compressed planes. Prefill runs in one chunk in both
    # servers, so PP=1 and PP=3 read back exactly the same quantized K/V.
    return _greedy(server_pool.get(*BASE_ARGS, *INT8_KV, name="pp1-int8"))


def test_pp3_auto_greedy_equals_pp1(server_pool, pp1):
    _assert_pp3_equals_pp1(server_pool, INT8_KV, "auto", "10,10,10", pp1)


def test_pp3_uneven_split_greedy_equals_pp1_with_compressed_kv(server_pool, pp1):
    _assert_pp3_equals_pp1(server_pool, INT8_KV, "8,11,11", "8,11,11", pp1)
