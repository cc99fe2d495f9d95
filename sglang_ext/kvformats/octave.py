"""octave_k3v4 / octave_k3v3: block-rotated Lloyd-Max codes with one energy-keeping fp16 scale per block.

Per (token, KV head), K and V separately, each 64-dim block b of the head:
  y = R_b x_b                      (rotation.py: signs then Walsh-Hadamard / 8; K and V have their own signs)
  norm2 = tree_sum(y * y)          (pairwise halves: s = s[:32] + s[32:], s = s[:16] + s[16:], ...)
  sigma = sqrt(norm2) * 0.125      (|y| / sqrt(64))
  code_i = #{thresholds m : y_i / sigma > m}     (codebook.py, nearest Lloyd-Max level, ties to the lower)
  scale = fp16(norm2 / tree_sum(y * L[code]))    (x . x_hat = |x|^2: energy-keeping, not least squares)
  an all-zero block (norm2 == 0) stores code 2**(bits-1) - 1 everywhere and scale 0.
Reconstruction: x_hat_b = R_b^T (scale * L[code]).

K bits per block: a block holding any rotary dim (rotary dims are the first rotary_dim dims of the head) gets
K_ROPE_BITS, the others 3 bits; with full RoPE (rotary_dim == head_dim) see FULL_ROPE_K_BITS.
V bits: 4 (k3v4) or 3 (k3v3) for every block.
Planes: k_codes uint8 [sum of K block bytes], k_scales float16 [D/64], v_codes uint8 [...], v_scales float16
[D/64]; blocks' bytes are concatenated in block order (packing.py gives a block's layout).
"""

from __future__ import annotations

import functools

import torch

from . import rotation
from .base import KVFormat
from .codebook import LEVELS, REVISION, thresholds
from .packing import BLOCK, BLOCK_BYTES, pack_block, unpack_block

K_ROPE_BITS = 4  # K blocks that carry rotary dims (partial-RoPE models)
K_NOPE_BITS = 3  # K blocks without rotary dims
# Full-RoPE models (every block is rotary): bits for every K block. Chosen by measurement, see docs/formats.md.
FULL_ROPE_K_BITS = 4
FP16_MAX = 65504.0


def tree_sum64(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (64) in the format's fixed pairwise-halves order."""
    h = x.shape[-1]
    while h > 1:
        h //= 2
        x = x[..., :h] + x[..., h:]
    return x[..., 0]


def levels_tensor(bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(LEVELS[bits], dtype=torch.float32, device=device)


def thresholds_tensor(bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(thresholds(bits), dtype=torch.float32, device=device)


def quantize_rotated_block(y: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y float32 [..., 64] (already rotated) -> (codes int64 [..., 64], scale float16 [...])."""
    norm2 = tree_sum64(y * y)
    nonzero = norm2 > 0
    sigma = torch.sqrt(norm2) * 0.125
    sigma = torch.where(nonzero, sigma, torch.ones_like(sigma))
    t = y / sigma[..., None]
    codes = torch.bucketize(t, thresholds_tensor(bits, y.device))  # = #{m : t > m}
    dot = tree_sum64(y * levels_tensor(bits, y.device)[codes])
    scale = torch.where(nonzero, norm2 / torch.where(nonzero, dot, torch.ones_like(dot)), torch.zeros_like(dot))
    return codes, scale.clamp(max=FP16_MAX).to(torch.float16)


class OctaveFormat(KVFormat):
    rotated = True
    revision = REVISION

    def __init__(self, name: str, v_bits: int, head_dim: int, rotary_dim: int | None = None,
                 full_rope_k_bits: int = FULL_ROPE_K_BITS):
        self.name = name
        super().__init__(head_dim, rotary_dim)
        self.num_blocks = head_dim // BLOCK
        if self.rotary_dim == head_dim:
            # full_rope_k_bits is a knob for the measurement that chose FULL_ROPE_K_BITS (errors.py)
            self.k_bits = (full_rope_k_bits,) * self.num_blocks
        else:
            self.k_bits = tuple(K_ROPE_BITS if b * BLOCK < self.rotary_dim else K_NOPE_BITS for b in range(self.num_blocks))
        self.v_bits = (v_bits,) * self.num_blocks
        self.k_code_bytes = sum(BLOCK_BYTES[b] for b in self.k_bits)
        self.v_code_bytes = sum(BLOCK_BYTES[b] for b in self.v_bits)

    def plane_specs(self):
        nb = self.num_blocks
        return {
            "k_codes": (torch.uint8, (self.k_code_bytes,)),
            "k_scales": (torch.float16, (nb,)),
            "v_codes": (torch.uint8, (self.v_code_bytes,)),
            "v_scales": (torch.float16, (nb,)),
        }

    def describe_bits(self) -> str:
        return "K " + "/".join(str(b) for b in self.k_bits) + " V " + "/".join(str(b) for b in self.v_bits)

    def rotate_k(self, x):
        return rotation.rotate(x, rotation.K_TENSOR)

    def rotate_v(self, x):
        return rotation.rotate(x, rotation.V_TENSOR)

    def unrotate_v(self, x):
        return rotation.unrotate(x, rotation.V_TENSOR)

    def _quantize_one(self, x: torch.Tensor, tensor: int, bits: tuple[int, ...]):
        y = rotation.rotate(x, tensor)  # [N, H, D] float32
        packed, scales = [], []
        for b, nbits in enumerate(bits):
            codes, scale = quantize_rotated_block(y[..., b * BLOCK:(b + 1) * BLOCK], nbits)
            packed.append(pack_block(codes, nbits))
            scales.append(scale)
        return torch.cat(packed, dim=-1).contiguous(), torch.stack(scales, dim=-1).contiguous()

    def quantize(self, k, v):
        self.check_kv(k, v)
        kc, ks = self._quantize_one(k, rotation.K_TENSOR, self.k_bits)
        vc, vs = self._quantize_one(v, rotation.V_TENSOR, self.v_bits)
        return {"k_codes": kc, "k_scales": ks, "v_codes": vc, "v_scales": vs}

    def dequantize_rotated(self, codes: torch.Tensor, scales: torch.Tensor, bits: tuple[int, ...]) -> torch.Tensor:
        """Packed codes [..., bytes] + scales [..., NB] -> float32 [..., D] in the rotated basis.

        Same values as levels[unpack_block(...)] * scale, looked up a byte at a time (`_byte_levels`)."""
        lead = codes.shape[:-1]
        out = torch.empty(*lead, len(bits), BLOCK, dtype=torch.float32, device=codes.device)
        off = 0
        for b, nbits in enumerate(bits):
            block = codes[..., off:off + BLOCK_BYTES[nbits]]
            if nbits == 4:  # one byte -> its two dims' levels
                idx = block
            else:  # a 2-bit-plane byte (4 dims) + the matching nibble of the 1-bit plane -> 4 dims' levels
                p1 = block[..., 16:24]
                nibbles = torch.stack([p1 & 15, p1 >> 4], dim=-1).reshape(*lead, 16)
                idx = block[..., :16].to(torch.int32) | (nibbles.to(torch.int32) << 8)
            vals = _byte_levels(nbits, codes.device)[idx.long()].reshape(*lead, BLOCK)
            torch.mul(vals, scales[..., b:b + 1].to(torch.float32), out=out[..., b, :])
            off += BLOCK_BYTES[nbits]
        return out.reshape(*lead, len(bits) * BLOCK)

    def dequantize_rotated_kv(self, planes):
        k = self.dequantize_rotated(planes["k_codes"], planes["k_scales"], self.k_bits)
        v = self.dequantize_rotated(planes["v_codes"], planes["v_scales"], self.v_bits)
        return k, v

    def dequantize(self, planes):
        k, v = self.dequantize_rotated_kv(planes)
        return rotation.unrotate(k, rotation.K_TENSOR), rotation.unrotate(v, rotation.V_TENSOR)


@functools.cache
def _byte_levels_cpu(bits: int) -> torch.Tensor:
    """4 bits: [256, 2], a packed byte's two dims (low nibble first). 3 bits: [4096, 4], index = 2-bit-plane byte
    | (1-bit-plane nibble << 8), the four dims that byte covers. Levels as float32, from unpack_block itself."""
    if bits == 4:
        packed = torch.arange(256, dtype=torch.uint8).view(256, 1).repeat(1, BLOCK_BYTES[4])
        return levels_tensor(4, "cpu")[unpack_block(packed, 4)[:, :2]].contiguous()
    i = torch.arange(4096)
    packed = torch.zeros(4096, BLOCK_BYTES[3], dtype=torch.uint8)
    packed[:, 0] = (i & 255).to(torch.uint8)  # dims 0-3: low bits from plane-2 byte 0
    packed[:, 16] = (i >> 8).to(torch.uint8)  # dims 0-3: high bits from plane-1 byte 0, bits 0-3
    return levels_tensor(3, "cpu")[unpack_block(packed, 3)[:, :4]].contiguous()


def _byte_levels(bits: int, device) -> torch.Tensor:
    return _byte_levels_cpu(bits).to(device)
