import torch

from sglang_ext.kvformats import rotation


def test_fwht_is_sylvester_hadamard_and_rotation_is_orthonormal():
    h = rotation.hadamard_matrix()
    assert torch.equal(rotation.fwht64(torch.eye(64)), h)
    assert torch.equal(h @ h, 64 * torch.eye(64))
    x = torch.randn(7, 3, 256, generator=torch.Generator().manual_seed(0))
    for tensor in (rotation.K_TENSOR, rotation.V_TENSOR):
        y = rotation.rotate(x, tensor)
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rotation.unrotate(y, tensor), x, rtol=1e-5, atol=1e-5)
        # block-local: changing block 1 leaves block 0 of the output alone
        x2 = x.clone()
        x2[..., 64:128] += 1
        assert torch.equal(rotation.rotate(x2, tensor)[..., :64], y[..., :64])


def test_signs_are_the_documented_hash():
    # Golden values: a change here changes the format (pages written before would read back wrong).
    assert rotation.fmix32(0) == 0
    assert rotation.fmix32(rotation.SIGN_SEED) == 0xA9B83680
    k0 = rotation.signs(rotation.K_TENSOR, 1)[0]
    assert k0[:8].tolist() == [-1.0, 1.0, 1.0, 1.0, -1.0, 1.0, 1.0, -1.0]
    v = rotation.signs(rotation.V_TENSOR, 4)
    assert not torch.equal(v[0], k0) and not torch.equal(v[0], v[1])
    assert set(v.unique().tolist()) == {-1.0, 1.0}
