"""int8: symmetric absmax per (token, KV head), separate K and V scales.

Planes: k_codes int8 [D], k_scales float32 [1], v_codes int8 [D], v_scales float32 [1].
The scales live in side planes rather than inline so each code row stays D bytes (a multiple of 128 at
D >= 128) and the kernels' row loads stay aligned; the cost is one extra 4-byte gather per token.

scale = absmax / 127 (float32); code = round_half_even(x / scale) clamped to [-127, 127]; an all-zero row
gets scale 0 and codes 0. x_hat = code * scale.
"""

from __future__ import annotations

import torch

from .base import KVFormat


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, H, D] -> (codes int8 [N, H, D], scales float32 [N, H, 1])."""
    x = x.to(torch.float32)
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = amax / 127.0
    safe = torch.where(amax > 0, scale, torch.ones_like(scale))
    codes = torch.round(x / safe).clamp_(-127, 127).to(torch.int8)
    return codes, scale


class Int8Format(KVFormat):
    name = "int8"

    def plane_specs(self):
        d = self.head_dim
        return {
            "k_codes": (torch.int8, (d,)),
            "k_scales": (torch.float32, (1,)),
            "v_codes": (torch.int8, (d,)),
            "v_scales": (torch.float32, (1,)),
        }

    def describe_bits(self) -> str:
        return "8"

    def quantize(self, k, v):
        self.check_kv(k, v)
        kc, ks = quantize_int8(k)
        vc, vs = quantize_int8(v)
        return {"k_codes": kc, "k_scales": ks, "v_codes": vc, "v_scales": vs}

    def dequantize(self, planes):
        k = planes["k_codes"].to(torch.float32) * planes["k_scales"]
        v = planes["v_codes"].to(torch.float32) * planes["v_scales"]
        return k, v
