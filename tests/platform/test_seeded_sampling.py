"""The CPU platform's MurmurHash3 (seeded sampling) against SGLang's own Triton kernel, run by the interpreter."""

import pytest
import torch
import triton

from sglang_ext.platform.seeded_sampling import murmur_hash32


def sglang_hash(seed, positions, cols):
    from sglang.kernels.ops.sampling.murmur_hash import murmur_hash32_kernel

    n, m = seed.shape[0], cols.shape[0]
    out = torch.empty((n, m), dtype=torch.uint32)
    murmur_hash32_kernel[(n, triton.cdiv(m, 1024))](seed, positions, cols, out, n, m, BLOCK_SIZE=1024)
    return out


def test_bit_identical_to_sglang_kernel():
    g = torch.Generator().manual_seed(0)
    seeds = [0, 1, 42, 2**32 - 1, 2**32, 2**40 + 7, 2**63 - 1, -1, -(2**63)]  # sampling_seed spans int64
    seed = torch.tensor(seeds, dtype=torch.int64)
    positions = torch.cat([torch.tensor([0, 1, 2**31 - 1]), torch.randint(0, 1 << 20, (len(seeds) - 3,), generator=g)])
    cols = torch.cat([torch.arange(1500), torch.randint(0, 1 << 30, (600,), generator=g)])
    ours = murmur_hash32(seed.to(torch.uint64), positions, cols)
    assert ours.dtype == torch.uint32 and ours.shape == (len(seeds), len(cols))
    assert torch.equal(ours.to(torch.int64), sglang_hash(seed.to(torch.uint64), positions, cols).to(torch.int64))


def test_hash_spreads_and_rejects_bad_shapes():
    h = murmur_hash32(torch.tensor([5]), torch.tensor([3]), torch.arange(4096)).to(torch.float64)
    u = h / 2**32
    assert 0.45 < u.mean() < 0.55 and len(torch.unique(h)) > 4090
    with pytest.raises(ValueError, match="one shape"):
        murmur_hash32(torch.tensor([1, 2]), torch.tensor([1]), torch.arange(3))
