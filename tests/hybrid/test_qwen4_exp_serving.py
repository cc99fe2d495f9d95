"""Tiny qwen4_exp (SGLang's hybrid MoE with hyper-connections, a hashed n-gram PLE table and QSA indexed
attention) on stock launch_server on the CPU platform, in float32:

- with the PLE table in RAM, greedy tokens and log-probabilities equal transformers' own float32 implementation
  of the same checkpoint (`Qwen4ExpForConditionalGeneration`) on 4 prompts sent together;
- with the table on SSD (`--ple-offload-backend ssd`: rows read from the checkpoint's safetensors shards) and
  NEXTN chain drafts from the model's own hyper-connected MTP layer (SGLang's Qwen4ExpForCausalLMMTP), the tokens
  and top-3 candidates equal the RAM server's plain decoding, log-probabilities within batching rounding, drafts
  are accepted, and the server says it serves the table from the checkpoint's shards.

The checkpoint: `prepare_tiny("qwen4_exp")` with the MTP layer made able to guess, as test_hybrid_mtp.py does for
Qwen3.5: the draft's input fusion passes only the next token's embedding (fc_embedding = I, fc_hidden = 0) and its
decoder layer adds nothing (o_proj, down_proj zero), so it drafts a bigram; the target's attention, GDN and MoE
outputs are scaled by 0.3 so that the bigram is sometimes the target's next token. Tree drafts are not run: SGLang's
qwen4_exp PLE supports only topk 1.

What runs on the CPU platform: the GDN layers through sglang_ext's torch ops, the QSA indexer through SGLang's
portable orchestration (`forward_native`, hybrid/qsa.py) with the batched block top-k and sparse attention of
hybrid/ops/qsa_sparse.py, the PLE rows and hyper-connections in the served dtype (ple/qwen4_served_dtype.py).
The tiny model's indexer budget (2048 tokens in 512 blocks) covers every prompt here, so every complete block
is selected: the selection itself is tested in test_qsa_sparse.py.

Flags: `--disable-radix-cache` on the RAM server (it compares the model, not the cache; qwen4_exp with the radix
cache on, page size 64 and the extra_buffer strategy, is test_hybrid_extra_buffer.py's). The SSD + NEXTN server runs
the radix cache (SGLang's extra_buffer strategy; NEXTN turns the overlap scheduler off): after the batch, the
151-token prompt sent again restores the state tracked at 128 tokens and gives its first reply's tokens; a float32 conv state as in
test_hybrid_serving.py; a 16-slot Mamba pool; `--mem-fraction-static 0.95` (the pool is capped by
--max-total-tokens; SGLang's default fraction failed its post-load check when other processes took RAM)."""

import concurrent.futures
import shutil

import pytest
import requests
import torch
from server import ServerProcess

from sglang_ext.models.tiny import prepare_tiny

PROMPT_LENGTHS = (6, 64, 71, 151)  # within a 64-token page, at, past and over two page boundaries
NEW_TOKENS = 16
FLAGS = ["--dtype", "float32", "--max-total-tokens", "2048", "--disable-radix-cache", "--disable-overlap-schedule",
         "--max-mamba-cache-size", "16", "--mem-fraction-static", "0.95"]
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# float32 on both sides, different summation orders (test_hybrid_serving.py measured 2e-5 on Qwen3.5).
LOGPROB_TOL = 1e-4
# RAM and SSD tables hold the same bf16 rows; the servers may still group the 4 requests into different prefill
# batches (arrival order), whose float32 GEMMs round differently: measured 4.8e-7 on one such pair. NEXTN's
# verify rows (4 per request) round as another batch shape does.
SAME_ROWS_TOL = 1e-5


NEXTN_CHAIN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
               "--speculative-num-draft-tokens", "4"]
BRANCH_SCALE = 0.3


def _guessing_mtp_checkpoint(base, out) -> str:
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    weights = load_file(base / "model.safetensors")
    hidden = weights["mtp.fc_embedding.weight"].shape[0]
    weights["mtp.fc_embedding.weight"] = torch.eye(hidden)
    weights["mtp.fc_hidden.weight"] = torch.zeros(hidden, hidden)
    for name in list(weights):
        if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * (0.0 if name.startswith("mtp.") else BRANCH_SCALE)
    save_file(weights, out / "model.safetensors")
    return str(out)


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory):  # model_dir: the built-in tokenizer the tiny model copies
    return _guessing_mtp_checkpoint(prepare_tiny("qwen4_exp"), tmp_path_factory.mktemp("qwen4-mtp") / "qwen4_exp")


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def _serve(checkpoint: str, extra: list[str], name: str, radix: bool = False) -> tuple[list[dict], str]:
    """The 4 prompts in one batch (varlen extend, batched decode); the replies and the server's log. radix: with the
    radix cache on, and the last prompt sent once more after the batch (its reply appended)."""
    flags = [f for f in FLAGS if not (radix and f in ("--disable-radix-cache", "--disable-overlap-schedule"))]
    server = ServerProcess(checkpoint, [*flags, *extra], env=ENV, name=name).start()
    try:
        def ask(ids):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
                    "return_logprob": True, "top_logprobs_num": 3}
            reply = requests.post(f"{server.url}/generate", json=body, timeout=600)
            reply.raise_for_status()
            return reply.json()

        with concurrent.futures.ThreadPoolExecutor(len(PROMPT_LENGTHS)) as pool:
            replies = list(pool.map(ask, _prompts()))
        if radix:
            replies.append(ask(_prompts()[-1]))
        return replies, server.log_text()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ram(checkpoint):
    return _serve(checkpoint, [], "tiny-qwen4_exp-ram")


def _tops(reply: dict) -> list[list[tuple[float, int]]]:
    return [[(value, token) for value, token, _ in step] for step in reply["meta_info"]["output_top_logprobs"]]


def test_ram_table_equals_transformers(ram, checkpoint):
    from transformers import Qwen4ExpForConditionalGeneration

    replies, _ = ram
    model = Qwen4ExpForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
    for ids, reply in zip(_prompts(), replies):
        tokens = reply["output_ids"]
        assert len(tokens) == NEW_TOKENS, f"prompt of {len(ids)} tokens: {len(tokens)} tokens served"
        # One forward over prompt + served tokens: greedy decoding gives the served tokens iff each is the argmax
        # after its prefix, which is what generate() would check one step at a time.
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids + tokens])).logits[0].double()
        logprobs = torch.log_softmax(logits[len(ids) - 1:-1], dim=-1)  # [NEW_TOKENS, vocab]
        assert logprobs.argmax(-1).tolist() == tokens, f"prompt of {len(ids)} tokens: greedy tokens differ"
        gap = max(abs(value - logprobs[step, token].item())
                  for step, top in enumerate(_tops(reply)) for value, token in top)
        assert gap < LOGPROB_TOL, f"prompt of {len(ids)} tokens: log-probabilities differ by {gap:.2e}"


def test_ssd_table_with_nextn_equals_ram_table(ram, checkpoint, record_property):
    ram_replies, ram_log = ram
    ssd_replies, ssd_log = _serve(checkpoint, ["--ple-offload-backend", "ssd", *NEXTN_CHAIN], "tiny-qwen4_exp-ssd-mtp",
                                  radix=True)
    assert "'mamba_radix_cache_strategy': 'extra_buffer'" in ssd_log
    *ssd_replies, again = ssd_replies
    assert ssd_replies[0]["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == 128, "the prompt sent again did not restore its tracked state"
    assert again["output_ids"] == ssd_replies[-1]["output_ids"], "radix hit: tokens differ from the first reply's"
    gap = max(abs(a - b) for hit_step, first_step in zip(_tops(again), _tops(ssd_replies[-1]))
              for (a, _), (b, _) in zip(hit_step, first_step))
    assert gap < SAME_ROWS_TOL, f"radix hit: log-probabilities differ from the first reply's by {gap:.2e}"
    assert "served from 2 shard tensor(s)" in ssd_log, "the SSD server did not open the checkpoint's table shards"
    assert "served from" not in ram_log
    verifies = sum(reply["meta_info"]["spec_verify_ct"] for reply in ssd_replies)
    accept_length = sum(len(reply["output_ids"]) for reply in ssd_replies) / verifies
    record_property("accept_length", accept_length)
    assert accept_length > 1.1, f"NEXTN: accept length {accept_length:.2f}: (almost) no MTP draft was accepted"
    for length, ram_reply, ssd_reply in zip(PROMPT_LENGTHS, ram_replies, ssd_replies):
        assert ssd_reply["output_ids"] == ram_reply["output_ids"], f"prompt of {length} tokens: tokens differ"
        assert [[t for _, t in step] for step in _tops(ssd_reply)] == [[t for _, t in step] for step in
                                                                          _tops(ram_reply)], f"prompt of {length}"
        gap = max(abs(a - b) for ssd_step, ram_step in zip(_tops(ssd_reply), _tops(ram_reply))
                  for (a, _), (b, _) in zip(ssd_step, ram_step))
        assert gap < SAME_ROWS_TOL, f"prompt of {length} tokens: log-probabilities differ by {gap:.2e}"


def test_speculative_decoding_with_the_host_tier_is_refused_in_one_line(tmp_path, monkeypatch):
    """qwen4_exp with NEXTN and the HiCache host tier together stopped scheduling on the CPU platform (each pair
    alone serves, test_hybrid_extra_buffer.py has radix + host tier): the launcher refuses the three in one line."""
    import json
    import types

    import sglang_ext.platform
    from sglang_ext.startup_checks import StartupError, check_qsa_spec_host_tier

    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"indexer_compress_ratio": 4}}))
    monkeypatch.setattr(sglang_ext.platform, "cpu_platform_active", lambda: True)

    def args(spec, host):
        return types.SimpleNamespace(model_path=str(tmp_path), speculative_algorithm=spec,
                                     enable_hierarchical_cache=host)

    with pytest.raises(StartupError):
        check_qsa_spec_host_tier(args("NEXTN", True))
    for spec, host in (("NEXTN", False), (None, True)):
        check_qsa_spec_host_tier(args(spec, host))
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"layer_types": ["linear_attention"]}}))
    check_qsa_spec_host_tier(args("NEXTN", True))  # a hybrid without QSA (Qwen3.5) serves the three together
