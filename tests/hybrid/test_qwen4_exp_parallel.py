"""Tiny qwen4_exp (Gated DeltaNet + QSA full attention, MoE, hyper-connections, n-gram PLE) sharded on the CPU
platform through gloo, float32, compared with transformers' float32 implementation of the same checkpoint
(`Qwen4ExpForConditionalGeneration`, which test_qwen4_exp_serving.py shows a single-process server equals):

- pipeline parallel, `--pp-size 3 --pp-layer-partition auto` with the PLE table on SSD (`--ple-offload-backend
  ssd`): the checkpoint has PLE layers 0 and 2 (`ple_layer_ids` [1, 3]), and the split puts them on different
  stages, so the n-gram batch is prepared from each stage's own input ids and each stage opens only its own
  layers' tables from the checkpoint's shards (the test reads which stage opened which table from the log);
  the hyper-connection streams cross the stage boundaries inside the widened hidden state;
- tensor parallel, `--tp-size 2` with the table in RAM: each rank holds half the n-gram table's rows (SGLang's
  vocabulary-parallel embedding, summed by an all-reduce), half the KV and GDN heads, and its share of each expert.

4 prompts sent at once (one varlen prefill, batched decode), 16 greedy tokens each: tokens equal, log-probabilities
within 1e-4 (float32 on both sides with other summation orders: transformers' kernels against SGLang's, and under
TP the all-reduce of row-parallel partial products; largest gap measured 5.8e-6).

Flags as test_qwen4_exp_serving.py (--disable-radix-cache: QSA's page size 64 needs the Mamba extra-buffer
strategy; a float32 conv state; a 16-slot Mamba pool)."""

import concurrent.futures
import re

import pytest
import requests
import torch
from server import ServerProcess

from sglang_ext.models.tiny import prepare_tiny
from sglang_ext.models.tiny_hybrid import qwen4_exp_config, write_hybrid
from sglang_ext.pp.partition import parse_partition, stage_ranges

PROMPT_LENGTHS = (6, 64, 71, 151)
NEW_TOKENS = 16
LOGPROB_TOL = 1e-4
PLE_LAYER_IDS = [1, 3]  # 1-based, GDN layers 0 and 2
FLAGS = ["--dtype", "float32", "--max-total-tokens", "2048", "--disable-radix-cache", "--disable-overlap-schedule",
         "--max-mamba-cache-size", "16", "--mem-fraction-static", "0.95"]
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# "[<time> PP1 TP0] PLE: model.layers.2.ple.ple_embedding served from ...": the rank prefix, then the layer
TABLE_LINE = re.compile(r"\[([^\]]*)\] PLE: model\.layers\.(\d+)\.ple\.ple_embedding served from")


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory):  # model_dir: the built-in tokenizer the tiny model copies
    prepare_tiny("qwen4_exp")

    def config():
        cfg = qwen4_exp_config()
        cfg["text_config"]["ple_layer_ids"] = PLE_LAYER_IDS
        return cfg

    folder = tmp_path_factory.mktemp("qwen4-ple-two-layers")
    write_hybrid("qwen4_exp", config)(folder)
    return str(folder)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def reference(checkpoint):
    from transformers import Qwen4ExpForConditionalGeneration

    return Qwen4ExpForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)


def _serve(checkpoint, prompts, extra, ranks, name) -> tuple[list[dict], dict, str]:
    """The 4 prompts in one batch; the replies, /server_info and the log."""
    # SGLang binds one NUMA node per rank unless told otherwise; more ranks than nodes need a core list each.
    env = {**ENV, "SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(r % 2) for r in range(ranks))}
    server = ServerProcess(checkpoint, [*FLAGS, *extra], env=env, name=name).start()
    try:
        def ask(ids):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
                    "return_logprob": True}
            reply = requests.post(f"{server.url}/generate", json=body, timeout=900)
            reply.raise_for_status()
            return reply.json()

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(ask, prompts))
        return replies, server.server_info(), server.log_text()
    finally:
        server.stop()


def _assert_equals_reference(replies, prompts, model, what, record_property):
    worst = 0.0
    for ids, reply in zip(prompts, replies):
        tokens = reply["output_ids"]
        assert len(tokens) == NEW_TOKENS, f"{what}, prompt of {len(ids)} tokens: {len(tokens)} tokens served"
        # One forward over prompt + served tokens: greedy decoding gives the served tokens iff each is the argmax
        # after its prefix.
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids + tokens])).logits[0].double()
        logprobs = torch.log_softmax(logits[len(ids) - 1:-1], dim=-1)
        expected = logprobs.argmax(-1).tolist()
        first_diff = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
        assert tokens == expected, f"{what}, prompt of {len(ids)} tokens: first difference at token {first_diff}"
        served = reply["meta_info"]["output_token_logprobs"]
        gap = max(abs(value - logprobs[step, token].item()) for step, (value, token, _) in enumerate(served))
        worst = max(worst, gap)
        assert gap < LOGPROB_TOL, f"{what}, prompt of {len(ids)} tokens: log-probabilities differ by {gap:.2e}"
    record_property("max_logprob_gap", worst)


def _rank(prefix: str, kind: str) -> int:
    match = re.search(rf"\b{kind}(\d+)\b", prefix)
    return int(match.group(1)) if match else 0


def test_pp3_auto_ssd_table_equals_transformers(checkpoint, prompts, reference, record_property):
    replies, info, log = _serve(checkpoint, prompts, ["--pp-size", "3", "--pp-layer-partition", "auto",
                                                      "--ple-offload-backend", "ssd"], 3, "qwen4_exp-pp3-ssd")
    assert info.get("pp_size") == 3, info
    match = re.search(r"SGLANG_PP_LAYER_PARTITION=([\d,]+) \(from --pp-layer-partition\)", log)
    assert match, "the server did not log the planned split"
    ranges = stage_ranges(parse_partition(match.group(1)))
    stage_of = {layer - 1: next(s for s, (a, b) in enumerate(ranges) if a <= layer - 1 < b) for layer in PLE_LAYER_IDS}
    record_property("partition", match.group(1))
    assert len(set(stage_of.values())) > 1, f"split {match.group(1)} puts every PLE layer on one stage"
    opened = {(_rank(prefix, "PP"), int(layer)) for prefix, layer in TABLE_LINE.findall(log)}
    assert opened == {(stage, layer) for layer, stage in stage_of.items()}, (
        f"(stage, PLE layer) tables opened from SSD: {sorted(opened)}; split {match.group(1)}")
    _assert_equals_reference(replies, prompts, reference, "pp 3 ssd", record_property)


def test_tp2_ram_table_equals_transformers(checkpoint, prompts, reference, record_property):
    replies, info, log = _serve(checkpoint, prompts, ["--tp-size", "2"], 2, "qwen4_exp-tp2")
    assert info.get("tp_size") == 2, info
    assert not TABLE_LINE.search(log), "the RAM server served a table from SSD"
    _assert_equals_reference(replies, prompts, reference, "tp 2", record_property)
