"""A tiny Llama-shaped model folder (random bf16 weights, tied embeddings) for checkpoint and layer tests."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "mlp_bias": False,
    "pretraining_tp": 1, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 3, "rms_norm_eps": 1e-5, "vocab_size": 64,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": True,
    "hidden_act": "silu", "max_position_embeddings": 256, "dtype": "bfloat16",
}
TOKENIZER_FILES = {"tokenizer.json": "{}", "tokenizer_config.json": "{}", "chat_template.jinja": "{{ messages }}"}


def write_tiny_llama(folder: Path, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    c = TINY_CONFIG
    h, kv = c["hidden_size"], c["num_key_value_heads"] * c["head_dim"]
    rand = lambda *shape: (torch.randn(*shape, generator=g) * 0.2).to(torch.bfloat16)  # noqa: E731
    tensors = {"model.embed_tokens.weight": rand(c["vocab_size"], h), "model.norm.weight": rand(h) + 1}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": rand(h, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(c["intermediate_size"], h),
            p + "mlp.up_proj.weight": rand(c["intermediate_size"], h),
            p + "mlp.down_proj.weight": rand(h, c["intermediate_size"]),
            p + "input_layernorm.weight": rand(h) + 1, p + "post_attention_layernorm.weight": rand(h) + 1,
        }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(c))
    for name, text in TOKENIZER_FILES.items():
        (folder / name).write_text(text)
    return folder
