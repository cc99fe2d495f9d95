"""Tiny seeded random-weight checkpoints for end-to-end tests of shapes the built-in model does not have.

`TINY_MODELS` maps a name to a writer `(folder) -> None` that fills an empty folder with config.json, one
float32 model.safetensors and the built-in model's tokenizer files (so prompts tokenize as for SmolLM2).
`prepare_tiny(name)` writes `$SGLANG_EXT_HOME/models/tiny-<name>` once and returns it.

Weights are drawn from a generator seeded by the model's name, independent of transformers' init order:
embeddings N(0, 1), every matrix N(0, 1 / fan_in) (activations keep unit scale through the layers), the
output head N(0, 9 / hidden) (logits with std ~3, so greedy picks are clear-cut and not near-ties that float
rounding between two attention backends could flip), norms at their identity (weight 1, bias 0). The layers'
output projections (o_proj, down_proj) are scaled by RESIDUAL_SCALE, so the residual stream stays close to the
token's embedding: the next token is often the "bigram" lm_head(embedding) predicts, which a draft that sees only
the next token's embedding (mimo-d128's MTP layer) can guess, so speculative decoding accepts drafts. Attention
still decides most tokens (removing it changed 84 of 96 greedy tokens of llama-d128 over 6 prompts; the bigram
predicted 38 of 90 next tokens).
The outputs are meaningless text; what the tests compare is two servers' tokens on the same checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from sglang_ext.env import ext_home

# Files copied from the built-in model's folder: tokenizer and chat template.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
_MARKER = ".sglang-ext-tiny.json"
_LOGIT_STD = 3.0
RESIDUAL_SCALE = 0.3
VOCAB_SIZE, BOS_ID, EOS_ID = 49152, 1, 2  # the built-in SmolLM2 tokenizer's


def _common_config(architecture: str, model_type: str, **fields) -> dict:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": VOCAB_SIZE,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "initializer_range": 0.02,
        **fields,
    }


def llama_d128_config(hidden_size: int = 512) -> dict:
    """Dense Llama, head_dim 128 (full RoPE), 4 query / 2 KV heads; hidden_size 512 = heads x head_dim, or another
    (llama-d128-h256: head_dim is not hidden / heads, as in MiMo)."""
    return _common_config(
        "LlamaForCausalLM", "llama", hidden_size=hidden_size, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, attention_bias=False, mlp_bias=False,
    )  # fmt: skip


def stablelm_d256_r64_config() -> dict:
    """Dense StableLM, head_dim 256 with RoPE on the first 64 dims (partial_rotary_factor 0.25), 2 query / 1 KV
    heads. SGLang's and transformers' StableLM both rotate only the first head_dim * partial_rotary_factor dims
    (SGLang's Llama reads the factor too, transformers' Llama does not)."""
    return _common_config(
        "StableLmForCausalLM", "stablelm", hidden_size=512, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, partial_rotary_factor=0.25, layer_norm_eps=1e-5,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.25},
        use_qkv_bias=False, qk_layernorm=False, use_parallel_residual=False, hidden_dropout=0.0,
        attention_dropout=0.0,
    )  # fmt: skip


def _seed_of(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def random_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor transformers' model for `config` has, drawn as the module docstring says (float32)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in AutoModelForCausalLM.from_config(hf_config).state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    hidden = config["hidden_size"]
    weights = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if "norm" in name:
            weights[name] = torch.ones(shape) if name.endswith(".weight") else torch.zeros(shape)
        elif name.endswith(".bias"):
            weights[name] = torch.zeros(shape)
        elif name == "model.embed_tokens.weight":
            weights[name] = torch.randn(shape, generator=generator)
        elif name == "lm_head.weight":
            weights[name] = torch.randn(shape, generator=generator) * (_LOGIT_STD / hidden**0.5)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = torch.randn(shape, generator=generator) * (RESIDUAL_SCALE / shape[1] ** 0.5)
        elif len(shape) == 2:
            weights[name] = torch.randn(shape, generator=generator) / shape[1] ** 0.5
        else:
            raise ValueError(f"tiny model: no rule for tensor {name} of shape {shape}")
    return weights


def _write_dense(name: str, config_fn: Callable[[], dict]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        from safetensors.torch import save_file

        config = config_fn()
        save_file(random_weights(config, _seed_of(name)), str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _copy_tokenizer(folder)

    return write


def _write_mimo_of(base_name: str) -> Callable[[Path], None]:
    """A MiMo (NEXTN) checkpoint of tiny model `base_name`: mtp_checkpoint's fixed-seed MTP layer, except that its
    input projection passes only the next token's embedding (input_proj = [0 | I]), so it drafts the bigram
    continuation the tiny model often takes (see the module docstring)."""

    def write(folder: Path) -> None:
        from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights, write_mtp_checkpoint

        base = prepare_tiny(base_name)
        mtp = fixed_seed_mtp_weights(base, 0)
        hidden = mtp["input_proj.weight"].shape[0]
        mtp["input_proj.weight"] = torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1)
        built = write_mtp_checkpoint(base, folder.with_name(folder.name + ".mimo"), mtp)
        for file in built.iterdir():
            shutil.move(str(file), folder / file.name)
        built.rmdir()

    return write


def _copy_tokenizer(folder: Path) -> None:
    import os

    from sglang_ext.env import TOKENIZER_DIR
    from sglang_ext.models.builtin import prepare

    source = Path(os.environ[TOKENIZER_DIR]) if os.environ.get(TOKENIZER_DIR) else prepare()
    copied = [f for f in _TOKENIZER_FILES if (source / f).is_file()]
    if "tokenizer.json" not in copied:
        raise FileNotFoundError(f"{source} has no tokenizer.json; run `python -m sglang_ext.models prepare --force`")
    for file in copied:
        shutil.copy2(source / file, folder / file)


TINY_MODELS: dict[str, Callable[[Path], None]] = {
    "llama-d128": _write_dense("llama-d128", llama_d128_config),
    "stablelm-d256-r64": _write_dense("stablelm-d256-r64", stablelm_d256_r64_config),
    # llama-d128 with one MTP layer, served as MiMo: target and draft of --speculative-algorithm NEXTN.
    "mimo-d128": _write_mimo_of("llama-d128"),
    # hidden 256 with 4 heads of 128 (head_dim != hidden / heads): SGLang's Qwen2 layers took
    # hidden / heads on the CPU platform (platform/explicit_head_dim.py)
    "llama-d128-h256": _write_dense("llama-d128-h256", lambda: llama_d128_config(hidden_size=256)),
    "mimo-d128-h256": _write_mimo_of("llama-d128-h256"),
}
# Hybrid GDN + full-attention models (qwen3_5, qwen3_5_moe, qwen4_exp): tiny_hybrid.py builds them from this
# module's helpers.
from sglang_ext.models.tiny_hybrid import HYBRID_TINY_MODELS

TINY_MODELS.update(HYBRID_TINY_MODELS)


def tiny_model_dir(name: str, root: Path | None = None) -> Path:
    return Path(root if root is not None else ext_home() / "models") / f"tiny-{name}"


def prepare_tiny(name: str, root: Path | None = None) -> Path:
    """Write tiny model `name` under `root` (default $SGLANG_EXT_HOME/models) unless already there; return it.

    Idempotent: a folder holding the completion marker is returned as is. The folder is written to a
    `.partial` sibling and renamed, so an interrupted run never leaves a folder that looks complete.
    Raises KeyError naming the known models for an unknown `name`.
    """
    if name not in TINY_MODELS:
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(sorted(TINY_MODELS))}")
    out = tiny_model_dir(name, root)
    if (out / _MARKER).is_file():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    TINY_MODELS[name](tmp)
    (tmp / _MARKER).write_text(json.dumps({"name": name}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
