"""Attention-output error of a format against a float64 reference: the lossy metric the tests threshold
and docs/formats.md reports.

    python -m tools.attention_error      # prints the error table (synthetic + SmolLM2 fixture)
"""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_ext.kvformats.base import KVFormat

# Named quality limits (relative attention-output error vs float64 attention on the exact K/V), enforced by
# tests/kvformats/test_quality.py; the measured values (docs/formats.md) sit about 20 % below them.
# Synthetic (synthetic_qkv, L 256, 2 KV heads x group 4): worst over seeds 0-1 and head_dim 64/128/256.
SYNTHETIC_MAX_ERR = {"int8": 0.045, "octave_k3v4": 0.22, "octave_k3v3": 0.29}
# SmolLM2-135M real Q/K/V (d 64, full RoPE): mean over the fixture's 5 captured layers.
SMOLLM2_MEAN_ERR = {"int8": 0.02, "octave_k3v4": 0.18, "octave_k3v3": 0.22}

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "kvformats" / "data" / "smollm2_qkv.safetensors"


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float,
                    q_positions: torch.Tensor | None = None) -> torch.Tensor:
    """float64 attention. q [M, Hq, D], k/v [L, Hkv, D]; query m sees keys 0..q_positions[m] (all if None)."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("mhd,lhd->hml", q.double(), k) * sm_scale
    if q_positions is not None:
        mask = torch.arange(k.shape[0])[None, :] <= q_positions[:, None]
        s = s.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(s, dim=-1), v)


def attention_rel_error(fmt: KVFormat, q, k, v, sm_scale: float, q_positions=None,
                        planes: dict[str, torch.Tensor] | None = None) -> float:
    """||o(dequantized K/V) - o(K/V)|| / ||o(K/V)||, both float64. `planes` overrides fmt.quantize(k, v)
    (the mutation tests pass corrupted planes)."""
    ref = exact_attention(q, k, v, sm_scale, q_positions)
    kh, vh = fmt.dequantize(planes if planes is not None else fmt.quantize(k, v))
    got = exact_attention(q, kh, vh, sm_scale, q_positions)
    return float((got - ref).norm() / ref.norm())


def synthetic_qkv(seed: int, length: int, num_kv_heads: int, group: int, head_dim: int,
                  outlier_channels: int = 4, outlier_scale: float = 12.0):
    """Seeded q [8, Hq, D], k/v [L, Hkv, D] with a few outlier channels in K (as RoPE'd keys show) and a
    query correlated with some keys so the softmax is peaked rather than flat."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(length, num_kv_heads, head_dim, generator=g)
    v = torch.randn(length, num_kv_heads, head_dim, generator=g)
    ch = torch.randperm(head_dim, generator=g)[:outlier_channels]
    k[..., ch] *= outlier_scale
    k += 0.5 * torch.randn(1, num_kv_heads, head_dim, generator=g)  # a shared bias direction
    picks = torch.randint(0, length, (8,), generator=g)
    q = k[picks].repeat_interleave(group, dim=1) * 0.3 + torch.randn(8, num_kv_heads * group, head_dim, generator=g)
    return q, k, v


def smollm2_fixture() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(FIXTURE))


def smollm2_errors(fmt: KVFormat, data: dict[str, torch.Tensor] | None = None) -> list[float]:
    """Per captured layer: relative attention error of the fixture's last queries (causal) over its K/V."""
    data = data if data is not None else smollm2_fixture()
    q, k, v = data["q"].float(), data["k"].float(), data["v"].float()
    t, nq = k.shape[1], q.shape[1]
    pos = torch.arange(t - nq, t)
    sm_scale = fmt.head_dim ** -0.5
    return [attention_rel_error(fmt, q[i], k[i], v[i], sm_scale, pos) for i in range(k.shape[0])]


def main() -> None:
    from sglang_ext.kvformats import FORMAT_NAMES, get_format
    from sglang_ext.kvformats.octave import OctaveFormat

    data = smollm2_fixture()
    cands = [get_format(n, 64) for n in FORMAT_NAMES[1:]]
    cands += [OctaveFormat("octave_k3v4[full-rope K 3 bits]", 4, 64, full_rope_k_bits=3),
              OctaveFormat("octave_k3v3[full-rope K 3 bits]", 3, 64, full_rope_k_bits=3)]
    print("SmolLM2-135M real Q/K/V (d 64, full RoPE), relative attention-output error per captured layer:")
    for fmt in cands:
        errs = smollm2_errors(fmt, data)
        print(f"  {fmt.name:<34} {fmt.bytes_per_token_head:>4} B  mean {sum(errs) / len(errs):.4f}  "
              + " ".join(f"{e:.4f}" for e in errs))
    print("synthetic (seed 0, L 512, 2 KV heads x group 4, outlier channels), relative attention-output error:")
    for d, r in ((64, None), (128, None), (256, 64)):
        for n in FORMAT_NAMES[1:]:
            fmt = get_format(n, d, r)
            q, k, v = synthetic_qkv(0, 512, 2, 4, d)
            print(f"  d {d:>3} rotary {fmt.rotary_dim:>3} {n:<13} {fmt.bytes_per_token_head:>4} B  "
                  f"{attention_rel_error(fmt, q, k, v, d ** -0.5):.4f}")


if __name__ == "__main__":
    main()
