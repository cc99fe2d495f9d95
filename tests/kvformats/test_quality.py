"""Lossy metrics with named thresholds: relative attention-output error vs a float64 reference on exact
K/V. Measured values (docs/formats.md) sit about 20 % under each threshold; every mutation (a dropped scale,
one bit position packed wrong, a missing rotation) lands far above it (measured >= 0.46)."""

import pytest
import torch
from kvformat_mutations import PLANE_MUTATIONS, missing_rotation

from sglang_ext.kvformats import get_format
from tools.attention_error import (
    SMOLLM2_MEAN_ERR,
    SYNTHETIC_MAX_ERR,
    attention_rel_error,
    smollm2_errors,
    smollm2_fixture,
    synthetic_qkv,
)

GEOMETRIES = [(64, None), (128, None), (256, 64)]


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_fixture()


def _smollm2_mean(fmt, data, planes_fn, layers=(1, 3)):
    q, k, v = data["q"].float(), data["k"].float(), data["v"].float()
    t, nq = k.shape[1], q.shape[1]
    pos = torch.arange(t - nq, t)
    errs = []
    for i in layers:
        planes = planes_fn(fmt, k[i], v[i]) if planes_fn else None
        errs.append(attention_rel_error(fmt, q[i], k[i], v[i], fmt.head_dim ** -0.5, pos, planes))
    return sum(errs) / len(errs)


@pytest.mark.parametrize("name", list(SYNTHETIC_MAX_ERR))
@pytest.mark.parametrize("head_dim,rotary_dim", GEOMETRIES)
def test_synthetic_attention_error_and_mutations(name, head_dim, rotary_dim):
    fmt = get_format(name, head_dim, rotary_dim)
    limit = SYNTHETIC_MAX_ERR[name]
    for seed in (0, 1):
        q, k, v = synthetic_qkv(seed, 256, 2, 4, head_dim)
        planes = fmt.quantize(k, v)
        err = attention_rel_error(fmt, q, k, v, head_dim ** -0.5, planes=planes)
        assert err < limit, f"{name} d{head_dim} seed {seed}: attention rel error {err:.4f} >= {limit}"
        for mut, fn in PLANE_MUTATIONS.items():
            bad = attention_rel_error(fmt, q, k, v, head_dim ** -0.5, planes=fn(fmt, planes))
            assert bad > 1.5 * limit, f"{name} d{head_dim}: mutation {mut} gives only {bad:.4f} (limit {limit})"
        if fmt.rotated:
            bad = attention_rel_error(fmt, q, k, v, head_dim ** -0.5, planes=missing_rotation(fmt, k, v))
            assert bad > 1.5 * limit, f"{name} d{head_dim}: missing rotation gives only {bad:.4f}"


@pytest.mark.parametrize("name", list(SMOLLM2_MEAN_ERR))
def test_smollm2_attention_error_and_mutations(name, smollm2):
    fmt = get_format(name, 64)
    limit = SMOLLM2_MEAN_ERR[name]
    errs = smollm2_errors(fmt, smollm2)
    mean = sum(errs) / len(errs)
    assert mean < limit, f"{name}: SmolLM2 mean attention rel error {mean:.4f} >= {limit} (per layer {errs})"
    for mut, fn in PLANE_MUTATIONS.items():
        bad = _smollm2_mean(fmt, smollm2, lambda f, k, v, fn=fn: fn(f, f.quantize(k, v)))
        assert bad > 1.5 * limit, f"{name}: mutation {mut} gives only {bad:.4f} (limit {limit})"
    if fmt.rotated:
        bad = _smollm2_mean(fmt, smollm2, missing_rotation)
        assert bad > 1.5 * limit, f"{name}: missing rotation gives only {bad:.4f}"


def test_full_rope_policy_is_the_better_one(smollm2):
    """The measurement behind FULL_ROPE_K_BITS = 4: 3-bit K on a full-RoPE model costs far more error."""
    from sglang_ext.kvformats.octave import OctaveFormat

    k4 = sum(smollm2_errors(get_format("octave_k3v4", 64), smollm2)) / 5
    k3 = sum(smollm2_errors(OctaveFormat("octave_k3v4", 4, 64, full_rope_k_bits=3), smollm2)) / 5
    assert k3 > 1.5 * k4, (k3, k4)


def test_fixture_is_real_model_data(smollm2):
    q, k, v = smollm2["q"], smollm2["k"], smollm2["v"]
    assert q.shape == (5, 64, 9, 64) and k.shape == (5, 448, 3, 64) and v.shape == k.shape
    # RoPE'd keys of a real model are far from isotropic: some channels carry much more energy
    energy = k.float().pow(2).mean(dim=(1, 2))
    assert (energy.max(dim=-1).values / energy.median(dim=-1).values).min() > 5
