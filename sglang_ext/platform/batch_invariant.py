"""Row-invariant token steps on the portable CPU platform: a token's K/V, codes and logits do not depend on how
many rows its forward step computes.

Why: on this platform's float32 BLAS (MKL) a projection gives the same row last-bit different results depending
on how many rows it computes together (`Linear(576, 192)`: M = 1, 2-3 and 4+ give three results, up to 1.2e-6
apart, and where the larger-M results part again depends on the shape). Speculative target verify projects 4 rows
where plain decode projects 1, so the K/V it stores and the logits it compares differ in the last bits from
sequential decode's; a quantized KV format turns such a difference at a code boundary into a different code, and
greedy output parts at the next near-tie.

What a token step does in the mode (forward modes DECODE and TARGET_VERIFY; under `--enable-deterministic-inference`
also prefill, extend and mixed steps, which otherwise keep their batched GEMMs): every linear layer (`UnquantizedLinearMethod.apply`) and the lm_head (`LogitsProcessor.
_compute_lm_head`) run in blocks of exactly ROW_BLOCK rows, the last block padded with zero rows, so each row is
computed by the same M = ROW_BLOCK kernel however many rows the step has and wherever the row sits in it (MKL's
sgemm for a fixed M gives a row the same bits whatever the other rows hold: tests/platform/test_batch_invariant.py
checks that on the machine it runs on). A 4-token verify of one request is one block, as is a decode step of up to
4 requests, so the mode costs little at small batches (docs/speculative-decoding.md has the measured cost). The
attention backends compute each query alone (kvcache/torch_backend.py, spec/verify_attention.py): every decode or
verify query attends alone, over exactly the keys it sees, with the decode routine. Everything else in a decoder
layer (norms, RoPE, activations, residual adds) is computed row by row already. A hybrid model's GDN decode step
keeps beta in float32 as the verify step does (hybrid/ops/recurrent.py: SGLang's packed decode kernel rounds it
to the model dtype, which in bf16 makes a decoded token's recurrent update differ from the verified one's).

When: on by default in every server whose KV pool is compressed (`--kv-cache-dtype int8|octave_k3v4|
octave_k3v3`; `SGLANG_EXT_ROW_INVARIANT=off` turns it off), and under SGLang's `--enable-deterministic-inference`
for any KV dtype.

Guarantee (CPU platform, same thread count): a token computed in a decode step at any batch size, or as row j of
a chain or tree verify, gets bitwise the same K/V (so the same codes in a compressed pool) and the same logits, given
the same earlier K/V. So speculative decoding's greedy output is the plain server's. Not covered by the default
over compressed KV: prefill / extend chunks (rows are computed together; two servers agree when they prefill the
same chunks; `--enable-deterministic-inference` covers them), the draft model's
forward (it changes which drafts are proposed, never the greedy output), and hosts with another BLAS build.

SGLang's own handling of `--enable-deterministic-inference`: `handle_deterministic_inference` accepts only its
listed attention backends (torch_native is added on this platform, `register`), forces the pytorch sampler and
turns the radix cache off for backends outside its radix list; `ModelRunner.maybe_enable_batch_invariant_mode`
would register Triton GEMMs for a CUDA/XPU/NPU dispatch key and raise here, so it is replaced by
`enable_for_runner`.
"""

from __future__ import annotations

import os

import torch

from sglang_ext.env import BATCH_INVARIANT, ROW_INVARIANT
from sglang_ext.hybrid.ops import recurrent

# Rows per GEMM call in a token step: a verify of NEXTN's or NGRAM's default 4 draft tokens is one block.
ROW_BLOCK = 4
# KV dtypes whose servers turn the mode on by default (lossy formats: a last-bit difference can flip a code).
COMPRESSED_KV_DTYPES = ("int8", "octave_k3v4", "octave_k3v3")
# Values of BATCH_INVARIANT the launcher exports: the deterministic flag, or a compressed pool.
_FOR_FLAG, _FOR_COMPRESSED_KV = "1", "compressed-kv"

_enabled = False
_prefill_too = True  # under --enable-deterministic-inference prefill and extend steps are token steps as well
_token_step = False  # the forward in progress is a token step of a runner in this mode


def enable() -> None:
    """Turn the mode on for this process (scheduler: target and draft runners share it)."""
    global _enabled
    _enabled = True
    recurrent.round_decode_beta(False)


def enable_for_compressed_kv() -> None:
    """Turn the mode on for decode and verify steps only (the default over compressed KV): prefill keeps its
    batched GEMMs and attention."""
    global _enabled, _prefill_too
    _enabled, _prefill_too = True, False
    recurrent.round_decode_beta(False)


def disable() -> None:
    global _enabled, _token_step, _prefill_too
    _enabled = _token_step = False
    _prefill_too = True
    recurrent.round_decode_beta(True)


def enabled() -> bool:
    return _enabled


def rows_alone() -> bool:
    """True while a token step runs with the mode on: linears and attention compute each row alone."""
    return _token_step


class token_step:
    """Context for one forward step: rows are computed alone inside it iff the mode is on and `active`."""

    def __init__(self, active: bool):
        self.active = active

    def __enter__(self):
        global _token_step
        self._saved = _token_step
        _token_step = _enabled and self.active
        return self

    def __exit__(self, *exc):
        global _token_step
        _token_step = self._saved
        return False


def in_row_blocks(fn, x: torch.Tensor) -> torch.Tensor:
    """fn(x) for x [..., K], computed as fn of blocks of exactly ROW_BLOCK rows ([ROW_BLOCK, K] each, the last one
    padded with zero rows) and concatenated: every row goes through the same M = ROW_BLOCK GEMM."""
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    if count == 0:
        return fn(x)
    pad = -count % ROW_BLOCK
    if pad:
        rows = torch.cat((rows, rows.new_zeros(pad, rows.shape[1])))
    out = torch.cat([fn(rows[i:i + ROW_BLOCK]) for i in range(0, rows.shape[0], ROW_BLOCK)])[:count]
    return out.view(*x.shape[:-1], out.shape[-1])


# -- hook bodies (registered by platform/hooks.py on the portable CPU platform) ---------------------------------

def linear_apply(original, method, layer, x, bias=None):
    """AROUND UnquantizedLinearMethod.apply."""
    if not _token_step:
        return original(method, layer, x, bias)
    return in_row_blocks(lambda r: original(method, layer, r, bias), x)


def compute_lm_head(original, processor, hidden_states, lm_head, embedding_bias=None, *, out=None):
    """AROUND LogitsProcessor._compute_lm_head (`out` is a preallocated buffer; rows are computed without it)."""
    if not _token_step:
        return original(processor, hidden_states, lm_head, embedding_bias, out=out)
    return in_row_blocks(lambda r: original(processor, r, lm_head, embedding_bias), hidden_states)


def model_runner_forward(original, runner, forward_batch, *args, **kwargs):
    """AROUND ModelRunner.forward: marks decode and target-verify steps as token steps, and prefill, extend and
    mixed steps too unless the mode is on for compressed KV only."""
    mode = forward_batch.forward_mode
    with token_step(mode.is_decode() or mode.is_target_verify()
                    or (_prefill_too and mode.is_extend_or_draft_extend_or_mixed())):
        return original(runner, forward_batch, *args, **kwargs)


def row_invariant_setting() -> str:
    """SGLANG_EXT_ROW_INVARIANT: "auto" (default: on over compressed KV) or "off"."""
    value = os.environ.get(ROW_INVARIANT, "auto")
    if value not in ("auto", "off"):
        raise ValueError(f"{ROW_INVARIANT}={value!r}: supported values are auto (default) and off")
    return value


def export_flag(_result, _cls, args) -> None:
    """AFTER ServerArgs.from_cli_args (launcher): tell the scheduler processes, spawned later, whether to install
    the hooks (`hooks_wanted`) and why. No stale value reaches them when neither applies."""
    if getattr(args, "enable_deterministic_inference", False):
        os.environ[BATCH_INVARIANT] = _FOR_FLAG
    elif getattr(args, "kv_cache_dtype", None) in COMPRESSED_KV_DTYPES and row_invariant_setting() == "auto":
        os.environ[BATCH_INVARIANT] = _FOR_COMPRESSED_KV
    else:
        os.environ.pop(BATCH_INVARIANT, None)


def hooks_wanted() -> bool:
    return os.environ.get(BATCH_INVARIANT) in (_FOR_FLAG, _FOR_COMPRESSED_KV)


def enable_for_runner(runner) -> None:
    """REPLACE ModelRunner.maybe_enable_batch_invariant_mode on the portable CPU platform."""
    from sglang_ext import compat

    if not compat.get_exec().deterministic.enable_deterministic_inference:
        if os.environ.get(BATCH_INVARIANT) == _FOR_COMPRESSED_KV:
            enable_for_compressed_kv()
        return
    if os.environ.get(BATCH_INVARIANT) != _FOR_FLAG:
        raise RuntimeError(
            "--enable-deterministic-inference on the portable CPU platform needs the server started from the "
            f"command line (python -m sglang.launch_server), which exports {BATCH_INVARIANT}=1 so that the "
            "scheduler installs the batch-invariant hooks; or set it in the environment")
    enable()
