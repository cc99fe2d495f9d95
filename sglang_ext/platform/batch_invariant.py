"""Batch-invariant inference on the portable CPU platform: SGLang's `--enable-deterministic-inference`.

Why: on this platform's float32 BLAS (MKL) a projection gives the same row last-bit different results depending
on how many rows it computes together (`Linear(576, 192)`: M = 1, 2-3 and 4+ give three results, up to 1.2e-6
apart; docs/speculative-decoding.md).
Speculative target verify projects 4 rows where plain decode projects 1, so the K/V it stores and the logits it
compares differ in the last bits from sequential decode's; a quantized KV format turns such a difference at a code
boundary into a different code, and greedy output parts at the next near-tie.

What the mode does, in token steps (forward modes DECODE and TARGET_VERIFY; prefill and draft extend keep their
batched GEMMs): every linear layer (`UnquantizedLinearMethod.apply`) and the lm_head (`LogitsProcessor.
_compute_lm_head`) run one row at a time, so each row is computed by the same M = 1 kernel however many rows the
step has. The attention backends do the same per query (kvcache/torch_backend.py, spec/verify_attention.py):
every decode or verify query attends alone, over exactly the keys it sees, with the decode routine. Everything
else in a decoder layer (norms, RoPE, activations, residual adds) is computed row by row already.

Guarantee (CPU platform, same thread count): a token computed in a decode step at any batch size, or as row j of
a chain verify, gets bitwise the same K/V (so the same codes in a compressed pool) and the same logits, given the
same earlier K/V. Not covered: prefill / extend chunks (rows are computed together; two servers agree when they
prefill the same chunks; SGLang turns the radix cache off in this mode for torch_native), the draft model's
forward (it changes which drafts are proposed, never the greedy output), and hosts with another BLAS build.

SGLang's own handling of the flag: `handle_deterministic_inference` accepts only its listed attention backends
(torch_native is added on this platform, `register`), forces the pytorch sampler and turns the radix cache off
for backends outside its radix list; `ModelRunner.maybe_enable_batch_invariant_mode` would register Triton GEMMs
for a CUDA/XPU/NPU dispatch key and raise here, so it is replaced by `enable`.
"""

from __future__ import annotations

import os

import torch

from sglang_ext.env import BATCH_INVARIANT

_enabled = False
_token_step = False  # the forward in progress is a token step of a runner in this mode


def enable() -> None:
    """Turn the mode on for this process (scheduler: target and draft runners share it)."""
    global _enabled
    _enabled = True


def disable() -> None:
    global _enabled, _token_step
    _enabled = _token_step = False


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


def one_row_at_a_time(fn, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """fn(x, ...) for x [..., K] computed on one row of x at a time ([1, K] each) and concatenated."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] <= 1:
        return fn(x, *args, **kwargs)
    out = torch.cat([fn(rows[i:i + 1], *args, **kwargs) for i in range(rows.shape[0])])
    return out.view(*x.shape[:-1], out.shape[-1])


# -- hook bodies (registered by platform/hooks.py on the portable CPU platform) ---------------------------------

def linear_apply(original, method, layer, x, bias=None):
    """AROUND UnquantizedLinearMethod.apply."""
    if not _token_step:
        return original(method, layer, x, bias)
    return one_row_at_a_time(lambda r: original(method, layer, r, bias), x)


def compute_lm_head(original, processor, hidden_states, lm_head, embedding_bias=None, *, out=None):
    """AROUND LogitsProcessor._compute_lm_head (`out` is a preallocated buffer; rows are computed without it)."""
    if not _token_step:
        return original(processor, hidden_states, lm_head, embedding_bias, out=out)
    return one_row_at_a_time(lambda r: original(processor, r, lm_head, embedding_bias), hidden_states)


def model_runner_forward(original, runner, forward_batch, *args, **kwargs):
    """AROUND ModelRunner.forward: marks decode and target-verify steps as token steps."""
    mode = forward_batch.forward_mode
    with token_step(mode.is_decode() or mode.is_target_verify()):
        return original(runner, forward_batch, *args, **kwargs)


def export_flag(_result, _cls, args) -> None:
    """AFTER ServerArgs.from_cli_args (launcher): tell the scheduler processes, spawned later, whether to install
    the hooks (`hooks_wanted`). No stale value reaches them when the flag is off."""
    if getattr(args, "enable_deterministic_inference", False):
        os.environ[BATCH_INVARIANT] = "1"
    else:
        os.environ.pop(BATCH_INVARIANT, None)


def hooks_wanted() -> bool:
    return os.environ.get(BATCH_INVARIANT) == "1"


def enable_for_runner(runner) -> None:
    """REPLACE ModelRunner.maybe_enable_batch_invariant_mode on the portable CPU platform."""
    from sglang_ext import compat

    if not compat.get_exec().deterministic.enable_deterministic_inference:
        return
    if not hooks_wanted():
        raise RuntimeError(
            "--enable-deterministic-inference on the portable CPU platform needs the server started from the "
            f"command line (python -m sglang.launch_server), which exports {BATCH_INVARIANT}=1 so that the "
            "scheduler installs the batch-invariant hooks; or set it in the environment")
    enable()
