"""Helpers of the paged-experts server tests: prompts, one batched greedy request, the comparison with the
unpaged reference, and the tiny qwen3_5_moe's hybrid serving flags."""

import concurrent.futures

import requests
import torch

PROMPT_LENGTHS = (6, 40, 71)
NEW_TOKENS = 12
LOGPROB_TOL = 1e-4  # as tests/hybrid/test_hybrid_serving.py: float32, different summation orders
# Hybrid flags as tests/hybrid/test_hybrid_serving.py (why: see its docstring).
HYBRID_ARGS = ("--dtype", "float32", "--max-total-tokens", "2000", "--mamba-radix-cache-strategy", "no_buffer",
               "--disable-overlap-schedule", "--max-mamba-cache-size", "16")
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def ask_batch(url: str) -> list[dict]:
    """Every prompt at once (one batch: varlen prefill, batched decode), greedy, with top-3 log-probabilities."""
    def ask(ids):
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
                "return_logprob": True, "top_logprobs_num": 3}
        reply = requests.post(f"{url}/generate", json=body, timeout=600)
        reply.raise_for_status()
        return reply.json()

    with concurrent.futures.ThreadPoolExecutor(len(PROMPT_LENGTHS)) as pool:
        return list(pool.map(ask, prompts()))


def assert_matches_reference(replies: list[dict], reference, what: str) -> None:
    for ids, reply, (expected, logprobs) in zip(prompts(), replies, reference):
        tokens = reply["output_ids"]
        assert tokens == expected, f"{what}, prompt of {len(ids)} tokens"
        tops = reply["meta_info"]["output_top_logprobs"]
        gap = max(abs(value - logprobs[len(ids) - 1 + step, token].item())
                  for step in range(NEW_TOKENS) for value, token, _ in tops[step])
        assert gap < LOGPROB_TOL, f"{what}, prompt of {len(ids)} tokens: log-probabilities differ by {gap:.2e}"


def guessing_mtp_checkpoint(base, out, branch_scale: float) -> str:
    """`base` with its MTP layer made able to guess, as tests/hybrid/test_hybrid_mtp.py does for the dense tiny
    Qwen3.5: the draft's input fusion passes only the next token's embedding (fc = [I | 0]) and its decoder layer
    adds nothing (attention o_proj and every down_proj of the MTP layer zero, its routed experts included), so it
    drafts the bigram lm_head(norm(embedding)); the target's attention, GDN, shared-expert and routed-expert outputs
    are scaled by `branch_scale`, so that bigram is often the target's next token."""
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    weights = load_file(base / "model.safetensors")
    hidden = weights["mtp.fc.weight"].shape[0]
    weights["mtp.fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    for name in list(weights):
        if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * (0.0 if name.startswith("mtp.") else branch_scale)
    save_file(weights, out / "model.safetensors")
    return str(out)
