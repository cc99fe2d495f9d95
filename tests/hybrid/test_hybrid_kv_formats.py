"""Compressed KV in a hybrid model's pool: tiny Qwen3.5 (3 Gated DeltaNet layers, 1 full-attention layer with
head_dim 256, RoPE on 64 dims, output gate, GQA 4:2) on stock launch_server on the CPU platform, float32, with
`--kv-cache-dtype int8|octave_k3v4|octave_k3v3`. SGLang's hybrid pool keeps the recurrent and conv state; the
full-attention layer's K/V lives in the format's planes.

One server per format (start-up dominates the cost), every check through it:
- capacity: SGLang sized the pool with the format's bytes for the full-attention layer only (its "KV sizing" log
  line), and the pool holds that many bytes per token, so a fixed budget holds bf16's bytes / the format's bytes
  times more tokens (bf16: 2 KV heads x 1 layer x K and V of 256 dims x 2 B = 2048 B per token).
- output: 4 prompts (6, 64, 71, 151 tokens) at once, prefill chunks of 64 and mixed prefill + decode batches;
  the oracle is transformers' own implementation of the same checkpoint with the full-attention layer's K and V
  passed through the format's quantize / dequantize (sglang_ext.kvformats, the spec) for every key, as the
  server reads them (SGLANG_EXT_KV_EXTEND_NEW_TOKENS=pool: every reader reads the stored bytes). Greedy tokens
  must equal the oracle's and the top-3 log-probabilities agree within LOGPROB_TOL. int8's greedy tokens must also
  equal the unquantized model's.
- a radix hit gives the cold output: the 151-token prompt after a cache flush, then again (same tokens, same
  log-probabilities within the tolerance), then a prompt sharing its first 128 tokens (with the no_buffer strategy
  SGLang keeps the recurrent state where a prefill chunk ended, so the hit covers the prefix up to such a point;
  its output is checked against the oracle).
- agent sessions: the server runs `--session-retention-seconds`; a second turn (prompt + answer + a new message)
  is cached up to the first turn's last answer token and answers as the same request cold.
- NEXTN and the HiCache host tier over the format (test_nextn_and_host_tier): the plain server's greedy output is
  the reference of NEXTN servers started beside it, chain and / or tree drafts and the host tier in the rotation
  of test_hybrid_compressed_combos.py (ROTATION; the checks are written there).
Every server runs torch_native (the CPU platform's attention); a case may name `triton` (our Triton kernels inside
SGLang's hybrid attention backend, under TRITON_INTERPRET=1), which its NEXTN servers then run too: the
interpreter made an octave_k3v3 NEXTN tree + host tier server cost 700 s, so the Triton backend on a hybrid is left
to tests/kvcache/test_triton_server.py.
Flags shared with tests/hybrid/test_hybrid_serving.py: float32 conv state, `--mamba-radix-cache-strategy
no_buffer --disable-overlap-schedule`, a 16-slot Mamba pool. The checkpoint is the tiny Qwen3.5 with its MTP layer
made able to guess (tests/hybrid/test_hybrid_mtp.py), so that NEXTN accepts drafts.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import requests
import torch
from server import ServerProcess, free_port
from test_hybrid_compressed_combos import (
    HICACHE_ARGS,
    ROTATION,
    check_nextn_equals_plain,
    greedy,
    host_round_trip,
    nextn_args,
)
from test_hybrid_mtp import _guessing_mtp_checkpoint

from sglang_ext.kvformats import get_format
from sglang_ext.models.tiny import prepare_tiny

HEAD_DIM, ROTARY_DIM, KV_HEADS, FULL_LAYERS = 256, 64, 2, 1
BF16_BYTES_PER_TOKEN = KV_HEADS * FULL_LAYERS * 2 * HEAD_DIM * 2
CHUNK = 64
PROMPT_LENGTHS = (6, 64, 71, 151)
NEW_TOKENS = 12
RADIX_SHARED = 2 * CHUNK  # the prefix a later prompt shares with the 151-token one
# float32 serving against the float64 oracle over float32 K/V: besides summation order, a K or V element that
# SGLang and transformers compute ~1e-6 apart can round to neighbouring codes. Largest top-3 log-probability gap
# measured over the 4 prompts x 12 tokens: int8 4.8e-5, octave_k3v4 9.1e-6, octave_k3v3 1.1e-5 (4.3e-4, and 4.2e-4
# on the Triton backend, on the checkpoint without the 0.3 branch scaling); 2e-3 leaves ~5x over the largest.
CASES = (
    # (format, attention backend, log-probability tolerance)
    ("int8", "torch_native", 2e-3),
    ("octave_k3v4", "torch_native", 2e-3),
    ("octave_k3v3", "torch_native", 2e-3),
)
SERVER_ARGS = (
    "--dtype", "float32", "--enable-cache-report", "--chunked-prefill-size", str(CHUNK), "--enable-mixed-chunk",
    "--max-total-tokens", "200000", "--random-seed", "0", "--max-running-requests", "4",
    "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--max-mamba-cache-size", "16",
    "--session-retention-seconds", "600",
)  # fmt: skip
# The NEXTN servers: the plain server's flags that decide the numbers (chunk size, seed, backend), a small pool.
NEXTN_SERVER_ARGS = (
    "--dtype", "float32", "--enable-cache-report", "--chunked-prefill-size", str(CHUNK), "--random-seed", "0",
    "--max-running-requests", "4", "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule",
    "--max-mamba-cache-size", "16", "--mem-fraction-static", "0.95",
)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory):  # model_dir: the built-in tokenizer the tiny model copies
    return _guessing_mtp_checkpoint(prepare_tiny("qwen3_5"), tmp_path_factory.mktemp("hybrid-kv") / "qwen3_5")


def _format_flags(name: str, backend: str) -> tuple[list[str], dict[str, str]]:
    """(flags, environment) of format `name` on `backend`, shared by the plain and the NEXTN servers."""
    env = {"SGLANG_MAMBA_CONV_DTYPE": "float32", "SGLANG_EXT_KV_EXTEND_NEW_TOKENS": "pool"}
    args = ["--kv-cache-dtype", name, "--attention-backend", backend]
    if backend == "triton":
        env["TRITON_INTERPRET"] = "1"
        args += ["--triton-attention-num-kv-splits", "2"]
    return args, env


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def kv_server(request, checkpoint):
    name, backend, tol = request.param
    args, env = _format_flags(name, backend)
    proc = ServerProcess(checkpoint, [*SERVER_ARGS, *args], env=env, name=f"hybrid-{name}").start()
    proc.fmt = get_format(name, HEAD_DIM, ROTARY_DIM)
    proc.backend = backend
    proc.tol = tol
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def model(checkpoint):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager").eval()


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def _ask(server, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
            "return_logprob": True, "top_logprobs_num": 3}
    reply = requests.post(f"{server.url}/generate", json=body, timeout=900)
    reply.raise_for_status()
    return reply.json()


def reference_logprobs(model, fmt, ids: list[int]) -> torch.Tensor:
    """log-softmax [len(ids), vocab] (float64) of `model` over `ids`, its full-attention layers attending to K and
    V passed through `fmt`'s quantize / dequantize (fmt None: unquantized), causal, in float64."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        # query [1, H, T, D], key / value [1, Hkv, T, D] after norm and RoPE: what SGLang stores
        k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, Hkv, D]
        if fmt is not None:
            k, v = fmt.dequantize(fmt.quantize(k.float().contiguous(), v.float().contiguous()))
        group = query.shape[1] // k.shape[1]
        k = k.double().transpose(0, 1).repeat_interleave(group, 0)  # [H, T, D]
        v = v.double().transpose(0, 1).repeat_interleave(group, 0)
        scores = query[0].double() @ k.transpose(1, 2) * scaling
        t = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        out = torch.softmax(scores, -1) @ v  # [H, T, D]
        return out.transpose(0, 1)[None].to(query.dtype), None

    original = qwen.eager_attention_forward
    qwen.eager_attention_forward = attention
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
    finally:
        qwen.eager_attention_forward = original
    return torch.log_softmax(logits.double(), -1)


def check_against_reference(reply, ids, ref, tol, label, new_tokens=NEW_TOKENS) -> float:
    """Greedy tokens are the reference's argmax (where its top two differ by more than 2 tol) and the served top-3
    log-probabilities match the reference's within tol; returns the largest gap. `ref` is reference_logprobs over
    ids + the served tokens, so after a near-tie the later steps are still compared on the served continuation."""
    tokens = reply["output_ids"]
    assert len(tokens) == new_tokens, f"{label}: {len(tokens)} tokens"
    gap = 0.0
    for step, (token, tops) in enumerate(zip(tokens, reply["meta_info"]["output_top_logprobs"])):
        row = ref[len(ids) - 1 + step]
        best2 = torch.topk(row, 2).values
        if best2[0] - best2[1] > 2 * tol:
            assert token == int(row.argmax()), f"{label}: step {step} token {token}, reference {int(row.argmax())}"
        gap = max(gap, *(abs(value - row[t].item()) for value, t, _ in tops))
    assert gap < tol, f"{label}: log-probabilities differ from the reference by {gap:.2e} (tolerance {tol:.0e})"
    return gap


def test_capacity_grows_by_the_byte_ratio(kv_server, record_property):
    fmt = kv_server.fmt
    cell = KV_HEADS * FULL_LAYERS * fmt.bytes_per_token_head
    sized = f"sglang-ext KV sizing: {fmt.name} cell size {cell} bytes per token"
    assert sized in kv_server.log_text(), f"server log lacks {sized!r}"
    info = kv_server.server_info()
    tokens = info["max_total_num_tokens"]
    pool_bytes = info["internal_states"][0]["memory_usage"]["kvcache"] * (1 << 30)  # GiB, 3 decimals
    measured = pool_bytes / tokens
    record_property("bytes_per_token", measured)
    record_property("capacity_vs_bf16", BF16_BYTES_PER_TOKEN / cell)
    assert abs(measured / cell - 1) < 0.01, f"{fmt.name}: pool holds {measured:.1f} B per token, sized {cell}"


def test_greedy_matches_quantized_reference(kv_server, model, record_property):
    prompts = _prompts()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:  # varlen extend, chunks, mixed batches
        served = list(pool.map(lambda ids: _ask(kv_server, ids), prompts))
    fmt, tol = kv_server.fmt, kv_server.tol
    worst = 0.0
    for ids, reply in zip(prompts, served):
        ref = reference_logprobs(model, fmt, ids + reply["output_ids"])
        worst = max(worst, check_against_reference(reply, ids, ref, tol, f"{fmt.name}, prompt of {len(ids)}"))
        if fmt.name == "int8":
            plain = reference_logprobs(model, None, ids + reply["output_ids"])
            expected = [int(plain[len(ids) - 1 + s].argmax()) for s in range(NEW_TOKENS)]
            assert reply["output_ids"] == expected, f"int8, prompt of {len(ids)}: not the unquantized greedy tokens"
    record_property("max_logprob_gap", worst)
    running = [int(n) for n in re.findall(r"Prefill batch.*?#running-req: (\d+)", kv_server.log_text())]
    assert max(running, default=0) >= 1, f"no prefill chunk ran beside a decoding request (#running-req {running})"


def test_radix_hit_gives_the_cold_output(kv_server, model):
    prompts = _prompts()
    kv_server.flush_cache()
    cold = _ask(kv_server, prompts[3])
    assert cold["meta_info"]["cached_tokens"] == 0, cold["meta_info"]
    hit = _ask(kv_server, prompts[3])
    assert hit["meta_info"]["cached_tokens"] > 0, f"no radix hit: {hit['meta_info']}"
    assert hit["output_ids"] == cold["output_ids"]
    for step, (a, b) in enumerate(zip(hit["meta_info"]["output_top_logprobs"], cold["meta_info"]["output_top_logprobs"])):
        gap = max(abs(x[0] - y[0]) for x, y in zip(a, b))
        assert gap < kv_server.tol, f"radix hit vs cold: step {step} log-probabilities differ by {gap:.2e}"
    # A prompt sharing the first RADIX_SHARED tokens: with --mamba-radix-cache-strategy no_buffer SGLang keeps the
    # recurrent state at prefill-chunk ends only, so the hit covers the prefix up to the last such point in it.
    shared = prompts[3][:RADIX_SHARED] + prompts[2][:20]
    reply = _ask(kv_server, shared)
    cached = reply["meta_info"]["cached_tokens"]
    assert 0 < cached <= RADIX_SHARED, f"shared prefix: {cached} cached tokens"
    ref = reference_logprobs(model, kv_server.fmt, shared + reply["output_ids"])
    check_against_reference(reply, shared, ref, kv_server.tol, f"{kv_server.fmt.name}, radix hit")


def test_second_agent_turn_is_cached(kv_server):
    """With --session-retention-seconds: the second turn sends the first turn's prompt, its answer as returned and
    a new message; all of the first turn but its last answer token (never computed) comes from the cache, and the
    answer is the cold one."""
    gen = torch.Generator().manual_seed(7)
    prompt = [1] + torch.randint(3, 49000, (99,), generator=gen).tolist()
    kv_server.flush_cache()
    first = _ask(kv_server, prompt)
    turn2 = prompt + first["output_ids"] + torch.randint(3, 49000, (25,), generator=gen).tolist()
    second = _ask(kv_server, turn2)
    assert second["meta_info"]["cached_tokens"] == len(prompt) + len(first["output_ids"]) - 1, second["meta_info"]
    kv_server.flush_cache()
    cold = _ask(kv_server, turn2)
    assert cold["meta_info"]["cached_tokens"] == 0
    assert second["output_ids"] == cold["output_ids"]
    for step, (a, b) in enumerate(zip(second["meta_info"]["output_top_logprobs"],
                                      cold["meta_info"]["output_top_logprobs"])):
        gap = max(abs(x[0] - y[0]) for x, y in zip(a, b))
        assert gap < kv_server.tol, f"second turn vs cold: step {step} log-probabilities differ by {gap:.2e}"


def test_nextn_and_host_tier(kv_server, checkpoint, record_property):
    """The NEXTN servers of this format's ROTATION: greedy = this plain server's, and with the host tier on, the
    host round trip of an agent turn (test_hybrid_compressed_combos.py)."""
    name = kv_server.fmt.name
    kv_server.flush_cache()
    plain = greedy(kv_server)
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in plain)
    args, env = _format_flags(name, kv_server.backend)
    for draft, with_host_tier in ROTATION[name]:
        label = f"{name} NEXTN {draft}" + (" + host tier" if with_host_tier else "")
        pool_args = HICACHE_ARGS if with_host_tier else ("--max-total-tokens", "2000")
        server = ServerProcess(checkpoint, [*NEXTN_SERVER_ARGS, *args, *nextn_args(draft), *pool_args], env=env,
                               name=f"hybrid-{name}-{draft}").start()
        try:
            record_property(f"{draft}_accept_length", check_nextn_equals_plain(server, plain, label))
            if with_host_tier:
                host_round_trip(server, name)
        finally:
            server.stop()
        if with_host_tier:
            assert "packed MTP KV layers: target_layers=1, draft_layers=1" in server.log_text()


# --- refusals: a hybrid whose full-attention heads the format does not have ------------------------------------

def _tweaked_checkpoint(checkpoint: str, folder, **config) -> str:
    """A copy of the tiny checkpoint's config and tokenizer (no weights) with `config` changed."""
    folder.mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(f"{checkpoint}/{name}", folder / name)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return str(folder)


HEAD_DIM_REFUSAL = "int8: head_dim 96 is not supported; supported head_dim: (64, 128, 256)"


def test_check_supported_refuses_an_unsupported_head_dim(checkpoint, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_ext import compat
    from sglang_ext.kvcache import support

    model_config = ModelConfig(_tweaked_checkpoint(checkpoint, tmp_path / "d96", head_dim=96))
    assert mambaish_config(model_config) is not None and model_config.head_dim == 96
    monkeypatch.setattr(compat, "attention_backends", lambda: ("torch_native", "torch_native"))
    monkeypatch.setattr(compat, "get_parallel", lambda: SimpleNamespace(attn_dcp_size=1))
    kvc = SimpleNamespace(kv_cache_dtype_str="int8", use_mla_backend=False, is_hybrid_swa=False,
                          mambaish_config=mambaish_config(model_config), model_config=model_config,
                          server_args=SimpleNamespace(enable_hierarchical_cache=False))
    with pytest.raises(ValueError) as refused:
        support.check_supported(kvc)
    message = str(refused.value)
    assert "\n" not in message and message.endswith(HEAD_DIM_REFUSAL), message


def test_launch_server_refuses_an_unsupported_head_dim(checkpoint, tmp_path):
    # --load-format dummy: random weights of the config's shapes, so the refusal (at KV pool sizing) is reached.
    folder = _tweaked_checkpoint(checkpoint, tmp_path / "d96", head_dim=96)
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", folder, "--load-format", "dummy",
               "--port", str(free_port()), *SERVER_ARGS, "--kv-cache-dtype", "int8"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SGLANG_MAMBA_CONV_DTYPE"] = "float32"
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, env=env, start_new_session=True)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    refusal = f"--kv-cache-dtype int8 cannot serve model {folder}: {HEAD_DIM_REFUSAL}"
    assert any(line.endswith(refusal) for line in output.splitlines()), output[-3000:]
