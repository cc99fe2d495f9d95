"""MtpLayer (plain torch) against transformers' Qwen2 decoder layer and RMSNorm with the same weights."""

import pytest
import torch
from tiny_llama import TINY_CONFIG, write_tiny_llama

from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights
from tools.draft_training.mtp_layer import MtpLayer


def test_mtp_layer_matches_transformers_qwen2_layer(tmp_path):
    qwen2 = pytest.importorskip("transformers.models.qwen2.modeling_qwen2")
    from transformers import Qwen2Config

    weights = fixed_seed_mtp_weights(write_tiny_llama(tmp_path / "base"), seed=5)
    g = torch.Generator().manual_seed(1)
    for name in ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"):
        weights[name] = torch.randn(weights[name].shape, generator=g) * 0.1  # nonzero biases: test they are used
    mtp = MtpLayer(TINY_CONFIG)
    mtp.load_state_dict(weights)

    config = Qwen2Config(**{k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "eager"
    block = qwen2.Qwen2DecoderLayer(config, layer_idx=0).eval()
    block.load_state_dict({n: t for n, t in weights.items() if n.startswith(("self_attn.", "mlp.", "input_layernorm", "post_"))})
    norms = {n: qwen2.Qwen2RMSNorm(config.hidden_size, eps=config.rms_norm_eps) for n in
             ("token_layernorm", "hidden_layernorm", "final_layernorm")}
    for n, norm in norms.items():
        norm.weight.data.copy_(weights[f"{n}.weight"])
    rope = qwen2.Qwen2RotaryEmbedding(config)

    hidden = torch.randn(2, 7, config.hidden_size, generator=g)
    embeds = torch.randn(2, 7, config.hidden_size, generator=g)
    positions = torch.arange(7).expand(2, -1)
    with torch.no_grad():
        ours, _ = mtp(hidden, embeds, positions)
        masked = embeds.clone()
        masked[:, 0] = 0  # MiMoMTP zeroes the token embedding at position 0
        x = torch.cat([norms["hidden_layernorm"](hidden), norms["token_layernorm"](masked)], -1) @ weights["input_proj.weight"].T
        causal = torch.full((7, 7), float("-inf")).triu(1)[None, None]
        out = block(x, attention_mask=causal, position_ids=positions, position_embeddings=rope(x, positions))
        out = out[0] if isinstance(out, tuple) else out
        reference = norms["final_layernorm"](out)
    err = (ours - reference).abs().max().item()
    assert err < 1e-5, f"max abs difference to transformers' Qwen2 layer: {err}"
