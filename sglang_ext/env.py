"""Every environment variable sglang-ext reads, in one place."""

import os
from pathlib import Path


def ext_home() -> Path:
    """Cache root for prepared models and generated files (`$SGLANG_EXT_HOME`, default ~/.cache/sglang-ext)."""
    return Path(os.environ.get("SGLANG_EXT_HOME", Path.home() / ".cache" / "sglang-ext")).expanduser()


# Name of the portable CPU platform's entry point; SGLang's own variable selects it.
SGLANG_PLATFORM = "SGLANG_PLATFORM"
# Which of our platforms the one entry point activates: portable_cpu or portable_gpu (platform/__init__.py).
PLATFORM_CHOICE = "SGLANG_EXT_PLATFORM"

# KV pool budget in GiB for the portable CPU platform when neither --mem-fraction-static nor
# --max-total-tokens is given (default: 10 % of available RAM, at most 2 GiB).
CPU_KV_BUDGET_GB = "SGLANG_EXT_CPU_KV_BUDGET_GB"

# Triton's own switch: "1" runs Triton kernels on CPU tensors (its interpreter). The portable CPU platform accepts
# `--attention-backend triton` only with it set.
TRITON_INTERPRET = "TRITON_INTERPRET"

# SGLang's per-rank CPU binding; the CPU platform fills it for multi-rank (TP/PP) servers when unset.
CPU_THREADS_BIND = "SGLANG_CPU_OMP_THREADS_BIND"

# SSD-resident PLE tables (`--ple-offload-backend ssd`, ple/sglang_glue.py), read in the scheduler process:
# row reader, `pread` (default; the file is never mapped) or `mmap` (mapped, RSS trimmed);
PLE_READER = "SGLANG_EXT_PLE_READER"
# reader threads per table (default 8);
PLE_THREADS = "SGLANG_EXT_PLE_THREADS"
# hot-row cache per table in MiB (default 0: none);
PLE_CACHE_MB = "SGLANG_EXT_PLE_CACHE_MB"
# unique rows per staging chunk (default 131072: one 8k-token prefill at 16 rows per token).
PLE_STAGING_ROWS = "SGLANG_EXT_PLE_STAGING_ROWS"

# Seconds of session retention (`--session-retention-seconds`), exported by the launcher for the scheduler
# processes, which build the radix cache. Unset or 0: off.
SESSION_RETENTION_SECONDS = "SGLANG_EXT_SESSION_RETENTION_SECONDS"

# Our Triton speculative-decoding ops on CUDA / HIP (spec/gpu_plan.py): "auto" (default: only where SGLang's own
# op is missing or greedy-only), "all" (every op SGLang builds natively: tree build, reconstruction, greedy and
# sampling verification, renormalisation), "off" (none).
SPEC_GPU_OPS = "SGLANG_EXT_SPEC_GPU_OPS"

# "1" in the processes of a server started with --enable-deterministic-inference on the portable CPU platform:
# exported by the launcher (platform/batch_invariant.py) so that the scheduler processes install the
# batch-invariant hooks; without it they install none and the default path is untouched.
BATCH_INVARIANT = "SGLANG_EXT_BATCH_INVARIANT"
# Row-invariant decode and verify steps over compressed KV (platform/batch_invariant.py): "auto" (default: on in
# every server with --kv-cache-dtype int8|octave_k3v4|octave_k3v3, so speculative decoding gives the plain server's
# greedy output) or "off".
ROW_INVARIANT = "SGLANG_EXT_ROW_INVARIANT"

# How an extend (prefill chunk) over a compressed KV pool attends to its own new tokens
# (kvcache/new_token_reads.py): "pool" (default: stored first and read back through the format, like every cached
# token: the same bytes for every reader) or "full" (at full precision, as computed).
KV_EXTEND_NEW_TOKENS = "SGLANG_EXT_KV_EXTEND_NEW_TOKENS"
# A folder holding the tokenizer files tiny test models copy (models/tiny.py); default: the built-in model's folder
# (prepared from its GGUF). The offline bundle points it at the tokenizer it carries.
TOKENIZER_DIR = "SGLANG_EXT_TOKENIZER_DIR"

# Paged MoE experts (sglang_ext/moe/sglang_glue.py): a file every process appends its routing and residency trace
# to (JSON lines). Unset: no trace hooks.
PAGED_EXPERTS_TRACE = "SGLANG_EXT_PAGED_EXPERTS_TRACE"
