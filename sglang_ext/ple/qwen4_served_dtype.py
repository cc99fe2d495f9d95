"""qwen4_exp computes in the dtype it is served in (`--dtype`), and `--ple-offload-backend ssd` alone offloads its
n-gram table. Applied by `sglang_glue` when SGLang first imports the qwen4_exp model module.

SGLang 0.5.23's qwen4_exp hard-codes bf16 in two places, so a float32 server failed at its first prefill:

- the n-gram (PLE) embedding holds its table in bf16 (fp8 for fp8 checkpoints) and returns bf16 rows, which
  reached float32 `key_proj` / `value_proj` ("expected m1 and m2 to have the same dtype");
- the hyper-connection modules (`GatedResidual`, built from `HyperConnectionConfig(params_dtype=torch.bfloat16)`)
  hold their weights in bf16 and cast every mixed and combined residual stream to bf16.

The served dtype is the one SGLang's loader makes torch's default while it constructs the model. The embedding's
rows are cast to it (exact from bf16; the table keeps its storage dtype, the one the checkpoint and the offload
backends use), and the hyper-connection config is built with it. For a bf16 server both are no-ops.

With the ssd backend the table is built as the offloaded one (on the meta device, then the SSD class) whether or
not `--ple-offload-embedding` is given: that flag also makes the PLE layer create a CUDA stream for its prefetch,
which a CPU server does not have.
"""

from __future__ import annotations

import functools

import torch

from sglang_ext import compat


def patch(module, ssd_backend: str) -> None:
    """Patch the qwen4_exp model module (`compat.QWEN4_MODULE`) in place."""
    _patch_ngram_embedding(module, ssd_backend)
    hc_config_cls = getattr(module, compat.QWEN4_HC_CONFIG)

    def served_hc_config(**fields):
        return hc_config_cls(**{**fields, "params_dtype": torch.get_default_dtype()})

    setattr(module, compat.QWEN4_HC_CONFIG, served_hc_config)


def _patch_ngram_embedding(module, ssd_backend: str) -> None:
    ngram_cls = getattr(module, compat.QWEN4_NGRAM_EMBEDDING)
    layer_cls = getattr(module, compat.QWEN4_PLE_LAYER)
    original_init, original_forward = ngram_cls.__init__, ngram_cls.forward
    original_consume = getattr(layer_cls, compat.QWEN4_CONSUME_PREFETCHED)

    # functools.wraps: the patched methods keep SGLang's signatures for inspect (compat's signature check)
    @functools.wraps(original_init)
    def __init__(self, config, embedding_dim, *args, **kwargs) -> None:
        offload = config.ple_offload_embedding
        if getattr(config, "ple_offload_backend", None) == ssd_backend:
            config.ple_offload_embedding = True
        try:
            original_init(self, config, embedding_dim, *args, **kwargs)
        finally:
            config.ple_offload_embedding = offload
        self.served_dtype = torch.get_default_dtype()

    @functools.wraps(original_forward)
    def forward(self, batch, forward_batch):
        return original_forward(self, batch, forward_batch).to(self.served_dtype)

    @functools.wraps(original_consume)
    def consume_prefetched(self, forward_batch):
        return original_consume(self, forward_batch).to(self.ple_embedding.served_dtype)

    ngram_cls.__init__, ngram_cls.forward = __init__, forward
    setattr(layer_cls, compat.QWEN4_CONSUME_PREFETCHED, consume_prefetched)
