"""PP=3 on the built-in SmolLM2 (30 layers) through stock `python -m sglang.launch_server` on the CPU platform:
greedy output equals PP=1's, with `--pp-layer-partition auto`, with an uneven explicit split, and over an int8 KV pool.

Needs the sglang_ext plugin to call `sglang_ext.pp.server_args.register()` and
`sglang_ext.pp.tied_lm_head.register()` (SmolLM2 ties its embeddings; see docs/pipeline-parallel.md).
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
# SGLang's CPU path binds one NUMA node per rank unless told otherwise; 3 ranks on a 1-node machine need a list.
PP3_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(rank % (os.cpu_count() or 1)) for rank in range(3))}


def _greedy(server) -> list[list[int]]:
    return [server.generate(p, max_new_tokens=NEW_TOKENS, ignore_eos=True)["output_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def pp1_output(server_pool):
    return _greedy(server_pool.get(*BASE_ARGS, name="pp1"))


@pytest.mark.parametrize("partition, expected", [("auto", "10,10,10"), ("8,11,11", "8,11,11")])
def test_pp3_greedy_equals_pp1(server_pool, pp1_output, partition, expected):
    args = (*BASE_ARGS, "--pp-size", "3", "--pp-layer-partition", partition)
    server = server_pool.get(*args, env=PP3_ENV, name=f"pp3-{partition}")
    used = re.search(r"SGLANG_PP_LAYER_PARTITION=([\d,]+) \(from --pp-layer-partition\)", server.log_text())
    assert used and used.group(1) == expected, server.log_tail()
    assert server.server_info().get("pp_size") == 3
    got = _greedy(server)
    for prompt, a, b in zip(PROMPTS, got, pp1_output):
        first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert len(a) == len(b) == NEW_TOKENS and first_diff is None, (
            f"{prompt!r}: first difference at token {first_diff}: pp3 {a} vs pp1 {b}"
        )


def test_pp3_greedy_equals_pp1_with_compressed_kv(server_pool):
    # Same comparison over an int8 KV pool: each PP rank holds its own layers' compressed planes. Prefill runs
    # in one chunk in both servers, so PP=1 and PP=3 read back exactly the same quantized K/V.
    kv = ("--kv-cache-dtype", "int8")
    pp1 = _greedy(server_pool.get(*BASE_ARGS, *kv, name="pp1-int8"))
    args = (*BASE_ARGS, *kv, "--pp-size", "3", "--pp-layer-partition", "auto")
    server = server_pool.get(*args, env=PP3_ENV, name="pp3-auto-int8")
    assert server.server_info().get("pp_size") == 3
    got = _greedy(server)
    for prompt, a, b in zip(PROMPTS, got, pp1):
        first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert len(a) == len(b) == NEW_TOKENS and first_diff is None, (
            f"{prompt!r}: first difference at token {first_diff}: pp3 {a} vs pp1 {b}"
        )
