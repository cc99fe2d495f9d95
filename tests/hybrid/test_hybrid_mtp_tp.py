"""NEXTN (MTP) chain drafts under tensor parallelism over int8 KV: the tiny Qwen3.5 hybrid at `--tp-size 2`.

Each rank holds one of the 2 KV heads (quantized to int8 in its own pool, the MTP layer's KV beside the target's)
and half of the GDN value heads with their recurrent and conv states. The NEXTN chain server (3 steps, 4 draft
tokens) must give the plain TP=2 int8 server's greedy tokens on 4 prompts, token for token, with drafts accepted.
Both servers are sharded the same way, so the all-reduce summation order is the same in both; what differs is
only verify (4 rows per step) against decode (1 row), as at TP=1 (tests/hybrid/test_hybrid_mtp.py, whose
guessing MTP checkpoint, prompts and flags this file reuses).
"""

import os

import pytest
from server import ServerProcess
from test_hybrid_mtp import HYBRID_ARGS, HYBRID_ENV, NEW_TOKENS, POOL_ARGS, _greedy, _guessing_mtp_checkpoint, _prompts

from sglang_ext.models.tiny import prepare_tiny

TP = 2
KV = ("--kv-cache-dtype", "int8", "--attention-backend", "torch_native", "--tp-size", str(TP))
CHAIN = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory):  # model_dir: the built-in tokenizer the tiny model copies
    return _guessing_mtp_checkpoint(prepare_tiny("qwen3_5"), tmp_path_factory.mktemp("hybrid-mtp-tp") / "qwen3_5")


def _serve(checkpoint, args, name):
    env = {**HYBRID_ENV, "SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(r % (os.cpu_count() or 1)) for r in range(TP))}
    return ServerProcess(checkpoint, [*HYBRID_ARGS, *POOL_ARGS, *KV, *args], env=env, name=name).start()


def _run(checkpoint, args, name):
    server = _serve(checkpoint, args, name)
    try:
        assert server.server_info().get("tp_size") == TP
        return _greedy(server)
    finally:
        server.stop()


def test_nextn_chain_tp2_int8_equals_plain_tp2(checkpoint, record_property):
    plain = _run(checkpoint, (), "hybrid-tp2-int8-plain")
    spec = _run(checkpoint, CHAIN, "hybrid-tp2-int8-nextn-chain")
    for ids, got, want in zip(_prompts(), spec, plain):
        first_diff = next((i for i, (a, b) in enumerate(zip(got["output_ids"], want["output_ids"])) if a != b), None)
        assert first_diff is None and len(got["output_ids"]) == NEW_TOKENS, (
            f"prompt of {len(ids)} tokens: NEXTN at TP=2 parts from plain TP=2 at token {first_diff}")
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in spec)
    accept_length = NEW_TOKENS * len(spec) / verifies
    record_property("accept_length", accept_length)
    print(f"NEXTN chain TP=2 int8: accept length {accept_length:.2f}, {NEW_TOKENS * len(spec)} tokens equal plain")
    assert accept_length > 1.1, f"accept length {accept_length:.2f}: (almost) no MTP draft was accepted"
