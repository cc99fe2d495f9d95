"""What a pipeline split needs to know about a model, read from its HF config dict. Core: never imports sglang.

`ModelShape.from_config(cfg)` turns a config.json dict (multimodal configs: their `text_config`) into
per-layer weight bytes, which layers hold a KV cache, the embedding / lm_head bytes, the head counts TP must
divide, and the layers that need the raw input ids. Weight bytes here are whole-model (TP 1); the planner
divides them by the TP size. `weights.py` can replace the estimate with the bytes of the safetensors files.

Estimate (bytes = parameters x bytes per parameter; biases and norms ignored, they are < 0.1 %):
  full attention   H*q_out + 2*H*kv*hd + heads*hd*H         (q_out doubles with attn_output_gate)
  MLA              q (lora or plain) + kv_a + kv_b + o      (DeepSeek-style `kv_lora_rank`)
  linear attention H*(2*nk*dk + 2*nv*dv) + H*2*nv + (2*nk*dk + nv*dv)*conv + nv*dv*H   (Qwen3-Next / 3.5 GDN)
  dense MLP        3*H*I;  MoE layer  E*3*H*I_moe + H*E + shared expert 3*H*I_shared
  recurrent state  per request and linear-attention layer, as SGLang's Mamba pool holds it (configs/mamba_utils.py):
                   SSM nv*dv*dk in float32 (or the config's mamba_ssm_dtype) + conv window
                   (2*nk*dk + nv*dv)*(conv-1) in bfloat16 (SGLANG_MAMBA_CONV_DTYPE's default)
  embedding        V_pad*H on the first stage; lm_head V_pad*H on the last (also when tied: under PP SGLang
                   builds a separate lm_head on the last rank and fills it from the embedding weights)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

VOCAB_PAD = 64  # SGLang's DEFAULT_VOCAB_PADDING_SIZE (layers/vocab_parallel_embedding.py)

_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "bf16": 2.0, "fp16": 2.0, "half": 2.0}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Per-model facts the planner uses. Lists are indexed by layer id (0-based)."""

    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    rotary_dim: int
    model_dtype_bytes: float
    layer_weight_bytes: tuple[float, ...]  # resident weights of each layer, whole model (TP 1)
    layer_routed_bytes: tuple[float, ...]  # the routed-expert part of layer_weight_bytes (0 for dense layers)
    layer_has_kv: tuple[bool, ...]  # False for linear-attention (state-space) layers
    embed_bytes: float  # first stage: token embedding + per-layer-input tables kept on the device
    lm_head_bytes: float  # last stage
    raw_id_layers: tuple[int, ...]  # layers that read the raw input ids: must sit on stage 0
    raw_id_reason: str = ""  # what makes them need the ids (engram, per-layer inputs)
    tied_embeddings: bool = False
    mla_kv_dim: int = 0  # > 0 for MLA: elements per token per layer (not split by TP)
    divisibility: tuple[tuple[str, int], ...] = ()  # (what, size) TP must divide, besides the heads
    num_experts: int = 0
    experts_per_token: int = 0
    linear_state_bytes: float = 0.0  # one request's recurrent state in one linear-attention layer, TP 1

    @property
    def layer_has_state(self) -> tuple[bool, ...]:
        """Layers whose per-request recurrent state sits in SGLang's Mamba pool (the linear-attention ones)."""
        return tuple(not kv for kv in self.layer_has_kv) if self.linear_state_bytes else (False,) * self.num_layers

    def touched_expert_fraction(self, batch: int) -> float:
        """Expected share of a MoE layer's routed experts that `batch` tokens read, each picking
        experts_per_token of num_experts uniformly: 1 - (1 - k/E)^batch."""
        if not self.num_experts:
            return 1.0
        return 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** max(1, batch)

    @property
    def num_kv_layers(self) -> int:
        return sum(self.layer_has_kv)

    def total_weight_bytes(self) -> float:
        return sum(self.layer_weight_bytes) + self.embed_bytes + self.lm_head_bytes

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "") -> "ModelShape":
        return _shape_from_config(config, name)


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (multimodal configs nest it under text_config)."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping) and "num_hidden_layers" in inner:
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(inner)
        return merged
    return dict(config)


def _weight_bytes_per_param(cfg: Mapping[str, Any], model_bytes: float) -> float:
    """Bytes per linear-layer parameter, from quantization_config when the checkpoint is quantized."""
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits") or q.get("weight_bits") or q.get("num_bits")
    if bits is None and isinstance(q.get("config_groups"), Mapping):  # compressed-tensors
        for group in q["config_groups"].values():
            bits = (group.get("weights") or {}).get("num_bits")
            break
    if bits is not None:
        group = q.get("group_size") or 128
        group = 128 if group in (-1, 0) else group
        return float(bits) / 8.0 + 2.0 / float(group)  # + one fp16 scale per group
    if method in ("fp8", "fbgemm_fp8", "modelopt"):
        return 1.0
    if method in ("mxfp4", "nvfp4", "modelopt_fp4"):
        return 0.5 + 1.0 / 16.0
    return model_bytes


def _moe_layer_ids(cfg: Mapping[str, Any], num_layers: int) -> set[int]:
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0
    if not experts:
        return set()
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    first_dense = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    return {
        i
        for i in range(num_layers)
        if i not in mlp_only and (i + 1) % step == 0 and i >= first_dense and (i - first_dense) % freq == 0
    }


def _layer_kinds(cfg: Mapping[str, Any], num_layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == num_layers:
        return ["linear" if "linear" in str(t) or "mamba" in str(t) else "attention" for t in types]
    interval = cfg.get("full_attention_interval")
    if interval:
        return ["attention" if (i + 1) % int(interval) == 0 else "linear" for i in range(num_layers)]
    return ["attention"] * num_layers


def _raw_id_layers(cfg: Mapping[str, Any], num_layers: int) -> tuple[tuple[int, ...], str]:
    """Layers that must sit on stage 0 because they read the raw input ids, per the SGLang 0.5.23 model code:
    deepseek_v4 engram: `engram_layer_ids` (0-based; layers/engram.py hashes input ids);
    Gemma 3n-style per-layer inputs: `hidden_size_per_layer_input` (every layer reads its slice of a
    table looked up by input id at the model's top).
    Not qwen4_exp's PLE layers (`ple_layer_ids`): its model forward prepares the n-gram batch on every stage that
    holds a PLE layer, from that stage's own ForwardBatch.input_ids (each PP rank's scheduler builds the batch
    from the requests), with the n-gram history in that rank's request pool (models/qwen4_exp.py,
    Qwen4ExpModel.forward / _prepare_ple_batch); served at PP=3 with a PLE layer on stage 1 = transformers."""
    if cfg.get("engram_layer_ids"):
        return tuple(sorted({int(i) for i in cfg["engram_layer_ids"]})), "engram n-gram embedding"
    if cfg.get("hidden_size_per_layer_input"):
        return tuple(range(num_layers)), "per-layer input embedding"
    return (), ""


def _shape_from_config(config: Mapping[str, Any], name: str) -> ModelShape:
    cfg = text_config(config)
    L = int(cfg["num_hidden_layers"])
    H = int(cfg["hidden_size"])
    V = int(cfg["vocab_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or H // heads)
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    partial = float(cfg.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0)
    model_bytes = _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2.0)
    wbytes = _weight_bytes_per_param(cfg, model_bytes)
    V_pad = -(-V // VOCAB_PAD) * VOCAB_PAD

    # attention block
    mla_kv_dim = 0
    if cfg.get("kv_lora_rank"):
        r_kv, r_rope = int(cfg["kv_lora_rank"]), int(cfg.get("qk_rope_head_dim") or 64)
        nope, v_hd = int(cfg.get("qk_nope_head_dim") or 128), int(cfg.get("v_head_dim") or 128)
        q_lora = cfg.get("q_lora_rank")
        q = H * q_lora + q_lora * heads * (nope + r_rope) if q_lora else H * heads * (nope + r_rope)
        attn = q + H * (r_kv + r_rope) + r_kv * heads * (nope + v_hd) + heads * v_hd * H
        mla_kv_dim, hd, v_head_dim, rotary_dim = r_kv + r_rope, nope + r_rope, v_hd, r_rope
    else:
        q_out = heads * hd * (2 if cfg.get("attn_output_gate") else 1)
        attn = H * q_out + 2 * H * kv * hd + heads * hd * H
        v_head_dim, rotary_dim = hd, max(1, int(round(hd * partial)))
    nk, nv = int(cfg.get("linear_num_key_heads") or 0), int(cfg.get("linear_num_value_heads") or 0)
    dk, dv = int(cfg.get("linear_key_head_dim") or 0), int(cfg.get("linear_value_head_dim") or 0)
    conv = int(cfg.get("linear_conv_kernel_dim") or 4)
    linear = H * (2 * nk * dk + 2 * nv * dv) + H * 2 * nv + (2 * nk * dk + nv * dv) * conv + nv * dv * H
    ssm_bytes = _DTYPE_BYTES.get(str(cfg.get("mamba_ssm_dtype") or "float32"), 4.0)
    linear_state = nv * dv * dk * ssm_bytes + (2 * nk * dk + nv * dv) * (conv - 1) * 2.0

    # MLP block
    I = int(cfg.get("intermediate_size") or 4 * H)
    experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("moe_topk") or 0)
    I_moe = int(cfg.get("moe_intermediate_size") or I)
    I_shared = int(cfg.get("shared_expert_intermediate_size") or 0) or int(cfg.get("n_shared_experts") or 0) * I_moe
    moe_ids = _moe_layer_ids(cfg, L)

    raw_ids, raw_reason = _raw_id_layers(cfg, L)
    ple_ids = {int(i) - 1 for i in cfg.get("ple_layer_ids") or []} if not cfg.get("ple_offload_embedding") else set()
    # qwen4_exp PLE: one bf16 n-gram table per PLE layer, (ngram_size-1)*heads_per_ngram hash heads of about
    # ngram_vocab_size_base rows x (ple_embed_dim / heads) dims (Qwen4ExpPLELayer), unless offloaded to host
    hash_heads = max(1, (int(cfg.get("ngram_size") or 3) - 1) * int(cfg.get("heads_per_ngram") or 8))
    ple_dim = int(cfg.get("ple_embed_dim") or H) // hash_heads
    ple_table = float(cfg.get("ngram_vocab_size_base") or 0) * hash_heads * ple_dim * 2.0
    engram_rows = dict(zip(cfg.get("engram_layer_ids") or [], cfg.get("engram_num_embeddings") or []))

    kinds = _layer_kinds(cfg, L)
    weights, routed, has_kv = [], [], []
    for i in range(L):
        mix = linear if kinds[i] == "linear" else attn
        if i in moe_ids:
            experts_part = experts * 3 * H * I_moe
            mlp = experts_part + H * experts + 3 * H * I_shared
        else:
            experts_part, mlp = 0, 3 * H * I
        engram = float(engram_rows.get(i, 0)) * int(cfg.get("engram_head_dim") or 0)  # fp8 rows, 1 byte each
        extra = (ple_table if i in ple_ids else 0.0) + engram
        weights.append((mix + mlp) * wbytes + extra)
        routed.append(experts_part * wbytes)
        has_kv.append(kinds[i] == "attention")

    embed = V_pad * H * model_bytes
    if cfg.get("hidden_size_per_layer_input"):  # Gemma 3n-style per-layer input table, first stage
        rows = float(cfg.get("vocab_size_per_layer_input") or V)
        embed += rows * L * int(cfg["hidden_size_per_layer_input"]) * model_bytes
    divisibility = [("intermediate_size", I)] if len(moe_ids) < L else []
    if nk:
        divisibility += [("linear_num_key_heads", nk), ("linear_num_value_heads", nv)]
    return ModelShape(
        name=name or str(cfg.get("_name_or_path") or (cfg.get("architectures") or ["model"])[0]),
        num_layers=L,
        hidden_size=H,
        vocab_size=V,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        v_head_dim=v_head_dim,
        rotary_dim=rotary_dim,
        model_dtype_bytes=model_bytes,
        layer_weight_bytes=tuple(weights),
        layer_routed_bytes=tuple(routed),
        layer_has_kv=tuple(has_kv),
        embed_bytes=embed,
        lm_head_bytes=V_pad * H * model_bytes,
        raw_id_layers=raw_ids,
        raw_id_reason=raw_reason,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mla_kv_dim=mla_kv_dim,
        divisibility=tuple(divisibility),
        num_experts=experts if moe_ids else 0,
        experts_per_token=top_k if moe_ids else 0,
        linear_state_bytes=float(linear_state) if "linear" in kinds else 0.0,
    )
