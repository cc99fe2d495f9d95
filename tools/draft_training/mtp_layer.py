"""The MTP layer SGLang's `MiMoMTP` serves, in plain torch, for training and for simulating drafts.

Parameter names equal the checkpoint names under `mtp_checkpoint.MTP_PREFIX`, so `state_dict()` is what
`write_mtp_checkpoint` takes. The arithmetic follows SGLang's MiMoMTP + Qwen2DecoderLayer: RMSNorm in float32,
neox-style RoPE, grouped-query attention with q/k/v biases, SiLU-gated MLP, and the token embedding zeroed at
position 0 (MiMoMTP masks it there).
"""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [*positions.shape, head_dim] for neox-style rotation (halves, not interleaved pairs)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, rope_theta: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=True)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=True)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=True)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)

    def forward(self, x, positions, past_kv=None, mask=None, rows=None):
        """x: [B, T, H]; positions: [B, T]; past_kv: (k, v) each [B, kv_heads, S0, D] or None;
        mask: bool [T, S0 + T] or [B, T, S0 + T], True = may attend; None = causal over x (past_kv must be None).
        rows: sorted indices [R] into T: only these tokens query (causally, over all T; needs past_kv and mask
        None), the others only give keys and values.
        Returns (out [B, T or R, H], (k, v) of these T tokens, each [B, kv_heads, T, D])."""
        b, t, _ = x.shape
        xq = x if rows is None else x[:, rows]
        q = self.q_proj(xq).view(b, xq.shape[1], self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
        k = _rotate(k, cos, sin)
        q = _rotate(q, cos, sin) if rows is None else _rotate(q, cos[:, :, rows], sin[:, :, rows])
        if rows is not None:
            if past_kv is not None or mask is not None:
                raise ValueError("rows takes neither past_kv nor a mask")
            mask = rows[:, None] >= torch.arange(t)
        new_kv = (k, v)
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)
            v = torch.cat([past_kv[1], v], dim=2)
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if mask is None:
            if past_kv is not None:
                raise ValueError("a mask is required when past_kv is given")
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            attn_mask = mask[:, None] if mask.dim() == 3 else mask
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, q.shape[2], -1)), new_kv


class Mlp(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MtpLayer(nn.Module):
    """One MiMo MTP layer for a Llama/Qwen2-shaped `config` (a config.json dict)."""

    def __init__(self, config: dict):
        super().__init__()
        hidden, eps = config["hidden_size"], config["rms_norm_eps"]
        head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
        rope = config.get("rope_parameters") or {}
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        self.token_layernorm = RMSNorm(hidden, eps)
        self.hidden_layernorm = RMSNorm(hidden, eps)
        self.input_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, config["num_attention_heads"], config["num_key_value_heads"], head_dim, theta)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = Mlp(hidden, config["intermediate_size"])
        self.final_layernorm = RMSNorm(hidden, eps)

    def forward(self, hidden, next_embeds, positions, past_kv=None, mask=None, rows=None):
        """hidden: [B, T, H] target (or previous draft step) hidden states after the final norm, for position t;
        next_embeds: [B, T, H] embeddings of token t+1; positions: [B, T] (= t).
        Returns (out [B, T, H] after final_layernorm, whose lm_head logits predict token t+2; (k, v) of these T
        tokens for later draft steps). past_kv / mask / rows as in Attention.forward: with rows, out holds only
        those tokens [B, R, H] (training draws its loss from a subset of positions: a token's query, attention
        output and MLP cost about 4x its input projection, keys and values)."""
        next_embeds = next_embeds.masked_fill((positions == 0)[..., None], 0.0)
        x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(next_embeds)], dim=-1))
        attn, new_kv = self.self_attn(self.input_layernorm(x), positions, past_kv, mask, rows)
        x = (x if rows is None else x[:, rows]) + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return self.final_layernorm(x), new_kv
