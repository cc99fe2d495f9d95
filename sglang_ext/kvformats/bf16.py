"""bf16: the uncompressed baseline. Planes k, v: bfloat16 [D] each."""

from __future__ import annotations

import torch

from .base import KVFormat


class BF16Format(KVFormat):
    name = "bf16"

    def plane_specs(self):
        d = self.head_dim
        return {"k": (torch.bfloat16, (d,)), "v": (torch.bfloat16, (d,))}

    def describe_bits(self) -> str:
        return "16"

    def quantize(self, k, v):
        self.check_kv(k, v)
        return {"k": k.to(torch.bfloat16).contiguous(), "v": v.to(torch.bfloat16).contiguous()}

    def dequantize(self, planes):
        return planes["k"].to(torch.float32), planes["v"].to(torch.float32)
