"""Qwen2-layer models keep their config's head_dim on the CPU platform.

On device "cpu" SGLang's ModelRunner prepares attention-head padding for tensor parallelism
(update_config.adjust_config_with_unaligned_cpu_tp), which records `original_num_attention_heads` on the config
whether or not any head was padded. SGLang's Qwen2DecoderLayer (Qwen2, MiMo and its MTP draft layer, ...) reads
that attribute as "heads were padded: head_dim = hidden_size // original_num_attention_heads" and ignores an
explicit `head_dim`. A model whose head_dim is not hidden_size / heads (MiMo-style: hidden 256, 4 heads of 128)
then computes K/V of head_dim 64 into a KV pool sized by ModelConfig's head_dim 128, and its first prefill fails
on every attention backend and KV dtype ("shape mismatch: value tensor of shape [6, 2, 64] cannot be broadcast
to indexing result of shape [6, 2, 128]"). Padding changes the number of heads, never a head's size, so an
explicit head_dim is the right one whether or not heads were padded: for that one constructor, and only when the
config names a head_dim the formula would get wrong, the attribute is hidden (and put back afterwards).
"""

from __future__ import annotations


def keep_explicit_head_dim(original, layer, *args, **kwargs):
    """AROUND hook of Qwen2DecoderLayer.__init__(self, config, layer_id=0, ...)."""
    config = kwargs["config"] if "config" in kwargs else args[0]
    head_dim = getattr(config, "head_dim", None)
    heads = getattr(config, "original_num_attention_heads", None)
    if head_dim is None or heads is None or config.hidden_size // heads == head_dim:
        return original(layer, *args, **kwargs)
    del config.original_num_attention_heads
    try:
        return original(layer, *args, **kwargs)
    finally:
        config.original_num_attention_heads = heads
