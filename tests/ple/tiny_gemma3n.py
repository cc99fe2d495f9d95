"""A tiny random Gemma 3n text model, written as a safetensors checkpoint SGLang can serve (a few MB).

Generated from a config at test time (never committed as weights). It borrows the built-in SmolLM2
tokenizer, so the vocabulary (49152) matches real token ids; the per-layer embedding table is
`[49152, num_layers * 16]` bf16 = 6 MiB, the tensor the SSD backend serves.
"""

import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
NUM_LAYERS = 4
PLE_DIM = 16


def tiny_gemma3n_config():
    from transformers import Gemma3nTextConfig

    return Gemma3nTextConfig(
        vocab_size=49152, vocab_size_per_layer_input=49152, hidden_size=64, hidden_size_per_layer_input=PLE_DIM,
        num_hidden_layers=NUM_LAYERS, intermediate_size=[128] * NUM_LAYERS, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, altup_num_inputs=4, laurel_rank=8, num_kv_shared_layers=0,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        activation_sparsity_pattern=[0.0] * NUM_LAYERS, sliding_window=64, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True,
        # SGLang 0.5.23 applies the final softcap with a Triton kernel, which has no CPU driver; HF rejects None.
        final_logit_softcapping=0.0,  # falsy: SGLang skips the softcap
    )


def build_tiny_gemma3n(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write config + random bf16 weights + the tokenizer to `out`; returns `out`."""
    import torch
    from transformers import Gemma3nForCausalLM

    torch.manual_seed(seed)
    config = tiny_gemma3n_config()
    model = Gemma3nForCausalLM(config)
    # HF's init (std 0.02) leaves the per-layer path (gate, projection, altup streams) too weak to move the
    # argmax; a fan-in init makes the per-layer embeddings decide tokens, so a wrong row changes the output.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and "embed" not in name:
                param.normal_(0.0, param.shape[1] ** -0.5)
            elif name.endswith("correct_output_scale"):  # 0 at init: it multiplies the per-layer input away
                param.fill_(1.0)
        model.model.embed_tokens_per_layer.weight.normal_(0.0, 1.0)
        model.model.embed_tokens.weight.normal_(0.0, 0.05)  # small next to the per-layer path
    model = model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["architectures"] = ["Gemma3nForCausalLM"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def greedy_tokens_hf(model_dir: Path, prompt_ids: list[int], steps: int, zero_ple: bool = False) -> list[int]:
    """Greedy continuation with HF transformers in float32 (logits = final hidden @ embed^T; the softcap is off).
    `zero_ple=True` zeroes the per-layer embedding table: the check that the output depends on it."""
    import torch
    from transformers import Gemma3nForCausalLM

    model = Gemma3nForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if zero_ple:
        model.model.embed_tokens_per_layer.weight.data.zero_()
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            ids.append(int(torch.argmax(model.model.embed_tokens.weight @ hidden)))
    return ids[len(prompt_ids):]
