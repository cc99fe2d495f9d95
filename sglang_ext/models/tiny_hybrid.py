"""Tiny hybrid (Gated DeltaNet + full attention) checkpoints: configs scaled down from Qwen3.5 / Qwen3.5-MoE.

What is kept from the real models: the 3:1 linear/full layer pattern, full attention with head_dim 256 of which
64 dims carry RoPE (partial_rotary_factor 0.25), the sigmoid output gate and GQA, GDN with grouped value heads
(3 per key head in the dense model as in the dense 27B, 2 in the MoE), a conv kernel of 4, one MTP layer
(`mtp.*`, which transformers ignores and SGLang serves with NEXTN), and top-k routing over 8 experts with a gated
shared expert for the MoE model. Widths and counts are small so a CPU runs them in seconds.

Weights follow tiny.py's rules (seeded by the model's name, independent of transformers' init), with the
parameters those rules do not cover: Gemma-style norms (scale 1 + w) start at w = 0, the GDN output norm
(scale w) at 1, A_log = log U(1, 16), dt_bias ~ N(0, 0.25), the depthwise conv N(0, 1 / width), each expert
N(0, 1 / fan_in), qwen4_exp's n-gram table N(0, 1) stored in bf16 (as released checkpoints store it; SGLang holds and
serves that table in bf16, transformers casts it to the load dtype: both hold the same values). Experts are written one tensor per expert and projection (the
layout of the released checkpoints, which both transformers and SGLang load).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

FULL_ATTENTION_INTERVAL = 4  # three GDN layers, then one full-attention layer
ROTARY_FACTOR = 0.25  # 64 of head_dim 256 rotate


def _hybrid_config(architecture: str, model_type: str, **fields) -> dict:
    from sglang_ext.models.tiny import _common_config

    return _common_config(
        architecture, model_type, hidden_size=256, num_hidden_layers=4, full_attention_interval=FULL_ATTENTION_INTERVAL,
        layer_types=["linear_attention" if (i + 1) % FULL_ATTENTION_INTERVAL else "full_attention" for i in range(4)],
        num_attention_heads=4, num_key_value_heads=2, head_dim=256, attn_output_gate=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": ROTARY_FACTOR},
        partial_rotary_factor=ROTARY_FACTOR, linear_conv_kernel_dim=4, linear_key_head_dim=32,
        linear_value_head_dim=32, rms_norm_eps=1e-6, attention_bias=False, mtp_num_hidden_layers=1,
        mtp_use_dedicated_embeddings=False, **fields,
    )  # fmt: skip


def qwen3_5_config() -> dict:
    """Dense Qwen3.5 (`Qwen3_5ForCausalLM`): 2 GDN key heads with 3 value heads each, as the 27B's 16 / 48."""
    return _hybrid_config("Qwen3_5ForCausalLM", "qwen3_5_text", intermediate_size=512, linear_num_key_heads=2,
                          linear_num_value_heads=6)


def qwen3_5_moe_config() -> dict:
    """Qwen3.5-MoE (`Qwen3_5MoeForCausalLM`): every layer's MLP is top-2 of 8 experts plus a gated shared expert."""
    return _hybrid_config("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", linear_num_key_heads=2,
                          linear_num_value_heads=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                          shared_expert_intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[], router_aux_loss_coef=0.001, output_router_logits=False)


def qwen4_exp_config() -> dict:
    """qwen4_exp (`Qwen4ExpForConditionalGeneration`, the class SGLang serves): the MoE text model above plus two
    hyper-connection streams, a hashed n-gram PLE table on GDN layer 1 (bigrams and trigrams, 2 heads each, stored
    in 2 shards), the QSA indexer transformers requires on full-attention layers (a budget of 2048 tokens in 512
    blocks, a size SGLang's top-k kernel takes, covering every test prompt: all blocks are selected) and a
    one-block vision tower that text prompts never run."""
    text = _hybrid_config("Qwen4ExpForCausalLM", "qwen4_exp_text", linear_num_key_heads=2, linear_num_value_heads=4,
                          num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                          shared_expert_intermediate_size=128, norm_topk_prob=True, router_aux_loss_coef=0.001,
                          output_router_logits=False, hc_count=2, hc_lowrank=16, ple_layer_ids=[1], ple_embed_dim=64,
                          ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=1000,
                          make_ngram_vocab_size_divisible_by=128, split_ngram_parts=2, indexer_n_heads=2,
                          indexer_kv_heads=1, indexer_head_dim=64, indexer_budget=2048, indexer_compress_ratio=4)
    for key in ("architectures", "torch_dtype", "tie_word_embeddings"):
        text.pop(key)
    vision = {"model_type": "qwen4_exp_vision", "depth": 1, "hidden_size": 64, "num_heads": 2,
              "intermediate_size": 128, "out_hidden_size": text["hidden_size"], "num_position_embeddings": 64}
    return {"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp", "text_config": text,
            "vision_config": vision, "tie_word_embeddings": False, "torch_dtype": "float32"}


def _text(config: dict) -> dict:
    return config.get("text_config", config)


def _text_prefix(config: dict) -> str:
    return "model.language_model." if "text_config" in config else "model."


def hf_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of transformers' model for `config` (built on the meta device). Buffers
    (qwen4_exp's n-gram hash multipliers and moduli) are left out: the model derives them from the config."""
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = getattr(transformers, config["architectures"][0])(hf_config)
    return {n: tuple(t.shape) for n, t in model.named_parameters()}


def _mtp_shapes(shapes: dict[str, tuple[int, ...]], config: dict) -> dict[str, tuple[int, ...]]:
    """The MTP layer SGLang's qwen3_5_mtp / qwen4_exp_mtp load: one full-attention decoder layer (the shapes of
    the model's first full-attention layer), a final norm, and the input fusion: fc over [embedding | hidden]
    with two input norms, or with hyper-connections fc_embedding / fc_hidden and the hidden norm over all
    streams plus the model's stream mixer."""
    text = _text(config)
    hidden, streams = text["hidden_size"], text.get("hc_count", 1)
    prefix = _text_prefix(config)
    layer = f"{prefix}layers.{text['layer_types'].index('full_attention')}."
    out = {"mtp.pre_fc_norm_embedding.weight": (hidden,), "mtp.pre_fc_norm_hidden.weight": (streams * hidden,),
           "mtp.norm.weight": (hidden,)}
    if streams > 1:
        out.update({"mtp.fc_embedding.weight": (hidden, hidden), "mtp.fc_hidden.weight": (hidden, hidden)})
    else:
        out["mtp.fc.weight"] = (hidden, 2 * hidden)
    for name, shape in shapes.items():
        if name.startswith(layer):
            out["mtp.layers.0." + name[len(layer):]] = shape
        elif name.startswith(prefix + "hyper_connection_mixer."):
            out["mtp." + name[len(prefix):]] = shape
    return out


def _draw(name: str, shape: tuple[int, ...], hidden: int, generator: torch.Generator) -> torch.Tensor:
    from sglang_ext.models.tiny import _LOGIT_STD

    if name.endswith(".bias"):
        return torch.zeros(shape)
    if name.startswith("model.visual.") and "norm" in name:
        return torch.ones(shape)  # LayerNorm
    if name.endswith("linear_attn.norm.weight"):
        return torch.ones(shape)
    if "norm" in name:
        return torch.zeros(shape)  # Gemma-style: scale is 1 + weight
    if name.endswith("A_log"):
        return torch.log(1.0 + 15.0 * torch.rand(shape, generator=generator))
    if name.endswith("dt_bias"):
        return 0.5 * torch.randn(shape, generator=generator)
    if name.endswith("conv1d.weight"):
        return torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=generator)
    if name.endswith("ngram_embedding.weight"):  # SGLang holds this table in bf16: values it keeps exactly
        return torch.randn(shape, generator=generator).to(torch.bfloat16).float()
    if name == "lm_head.weight":
        return torch.randn(shape, generator=generator) * (_LOGIT_STD / math.sqrt(hidden))
    if len(shape) >= 2:  # a matrix, a stack of expert matrices [experts, out, in], or a conv [out, in, ...]
        return torch.randn(shape, generator=generator) / math.sqrt(math.prod(shape[1:]) if len(shape) > 3
                                                                      else shape[-1])
    raise ValueError(f"tiny hybrid model: no rule for tensor {name} of shape {shape}")


def _split_experts(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' fused experts -> one tensor per expert and projection (checkpoint layout)."""
    base = name.rsplit(".", 1)[0]  # ...mlp.experts
    out = {}
    for e in range(tensor.shape[0]):
        if name.endswith("gate_up_proj"):
            gate, up = tensor[e].chunk(2, dim=0)
            out[f"{base}.{e}.gate_proj.weight"] = gate.contiguous()
            out[f"{base}.{e}.up_proj.weight"] = up.contiguous()
        else:
            out[f"{base}.{e}.down_proj.weight"] = tensor[e].contiguous()
    return out


def _split_ngram_table(name: str, tensor: torch.Tensor, parts: int) -> dict[str, torch.Tensor]:
    """qwen4_exp's n-gram table -> `...ngram_embedding.shard_{i}.weight`, ceil(rows / parts) rows each, in bf16
    as the released checkpoints store it (SGLang's offloaded and SSD tables serve the checkpoint's bytes)."""
    base = name[: -len(".weight")]
    rows = -(-tensor.shape[0] // parts)
    return {f"{base}.shard_{i}.weight": chunk.to(torch.bfloat16).contiguous()
            for i, chunk in enumerate(tensor.split(rows))}


def hybrid_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor of `config` (model and MTP layer), float32 (the n-gram table bf16), drawn as the
    module docstring says."""
    shapes = hf_shapes(config)
    shapes.update(_mtp_shapes(shapes, config))
    text = _text(config)
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name in sorted(shapes):
        tensor = _draw(name, shapes[name], text["hidden_size"], generator)
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            weights.update(_split_experts(name, tensor))
        elif name.endswith("ngram_embedding.weight"):
            weights.update(_split_ngram_table(name, tensor, text["split_ngram_parts"]))
        else:
            weights[name] = tensor
    return weights


# Image and video preprocessing of the Qwen VL processor (transformers' Qwen2VL / Qwen3VL defaults, patch 16).
_PROCESSOR_COMMON = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                     "image_std": [0.5, 0.5, 0.5]}
_VISION_PROCESSORS = {
    "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor", **_PROCESSOR_COMMON,
                                 "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
    "video_preprocessor_config.json": {"video_processor_type": "Qwen3VLVideoProcessor", **_PROCESSOR_COMMON,
                                       "size": {"shortest_edge": 4096, "longest_edge": 25165824}},
}


def write_hybrid(name: str, config_fn: Callable[[], dict]) -> Callable[[Path], None]:
    """A TINY_MODELS writer: config.json, model.safetensors (model + MTP layer) and the built-in tokenizer."""

    def write(folder: Path) -> None:
        from safetensors.torch import save_file

        from sglang_ext.models.tiny import _copy_tokenizer, _seed_of

        config = config_fn()
        save_file(hybrid_weights(config, _seed_of(name)), str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _copy_tokenizer(folder)
        if "vision_config" in config:  # SGLang builds the model's multimodal processor at start-up
            for file, fields in _VISION_PROCESSORS.items():
                (folder / file).write_text(json.dumps(fields, indent=2) + "\n")

    return write


HYBRID_TINY_MODELS: dict[str, Callable[[Path], None]] = {
    "qwen3_5": write_hybrid("qwen3_5", qwen3_5_config),
    "qwen3_5_moe": write_hybrid("qwen3_5_moe", qwen3_5_moe_config),
    "qwen4_exp": write_hybrid("qwen4_exp", qwen4_exp_config),
}
