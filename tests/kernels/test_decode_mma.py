"""The Gluon stage 1 (decode_mma's launch of mma_octave / mma_int8): its PTX lookups (mma_ptx) exhaustively through
the CPU emulator (tests/kernels/ptx_emulator.py), its scope errors, and on a GPU (TRITON_INTERPRET=0) the kernel
against the torch reference. Gluon kernels do not run under the interpreter, so on CPU only the first two parts run;
the build for sm_80 / sm_86 / sm_90 is checked by test_targets.py."""

import random

import pytest
import torch
from kernel_test_helpers import allocate_slots, indptr
from ptx_emulator import run as _run

from sglang_ext.kernels import decode_attention, store_kv
from sglang_ext.kvformats import get_format, reference
from sglang_ext.kvformats.codebook import LEVELS

mma_ptx = pytest.importorskip("sglang_ext.kernels.mma_ptx")
mma_lut = pytest.importorskip("sglang_ext.kernels.mma_lut")


def _bf16_levels() -> list[int]:
    t = torch.tensor(LEVELS[4], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
    return [int(x) & 0xFFFF for x in t]


LUT = [w & 0xFFFFFFFF for w in mma_ptx.lut_words()]


def test_one_token_lookup_gives_every_byte_its_two_levels():
    want = _bf16_levels()
    for start in range(0, 256, 4):  # every byte value in every byte position of the word
        for rot in range(4):
            bs = [(start + (i + rot) % 4) for i in range(4)]
            outs = _run(mma_ptx._ptx_4bit_one_token(), [sum(b << (8 * i) for i, b in enumerate(bs))] + LUT, 4)
            for k, b in enumerate(bs):
                expect = want[b & 15] | (want[b >> 4] << 16)
                assert outs[k] == expect, f"byte {b:#04x} at {k}: {outs[k]:#010x} != {expect:#010x}"


def test_two_token_lookup_interleaves_the_tokens_levels():
    want = _bf16_levels()
    rng = random.Random(0)
    words = [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(300)]
    words += [(sum(c << (4 * r) for r in range(8)), sum((15 - c) << (4 * r) for r in range(8))) for c in range(16)]
    for a, b in words:
        outs = _run(mma_ptx._ptx_4bit_two_tokens(), [a, b] + LUT, 8)
        for r in range(8):
            expect = want[(a >> 4 * r) & 15] | (want[(b >> 4 * r) & 15] << 16)
            assert outs[r] == expect, f"dim {r} of {a:#010x}, {b:#010x}: {outs[r]:#010x} != {expect:#010x}"


def test_three_bit_two_token_lookup_interleaves_the_tokens_levels():
    t = torch.tensor(LEVELS[3], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
    want = [int(x) & 0xFFFF for x in t]
    rng = random.Random(2)
    cases = [(rng.getrandbits(16), rng.getrandbits(16), rng.getrandbits(8), rng.getrandbits(8)) for _ in range(200)]
    # every code in every dim of both tokens
    cases += [(sum((c & 3) << 2 * r for r in range(8)), sum(((7 - c) & 3) << 2 * r for r in range(8)),
               0xFF * (c >> 2), 0xFF * ((7 - c) >> 2)) for c in range(8)]
    lut3 = LUT[len(mma_ptx.LUT_NAMES):]
    for i, (a2, b2, a1, b1) in enumerate(cases):
        h, j = i % 2, i % 4  # the halfword / byte of the loaded words that holds the lane's dims
        words = []
        for x, bits, pos in ((a2, 16, h), (b2, 16, h), (a1, 8, j), (b1, 8, j)):
            other = rng.getrandbits(32) & ~(((1 << bits) - 1) << bits * pos)  # the other lanes' bits
            words.append(other | x << bits * pos)
        outs = _run(mma_ptx._ptx_3bit_two_tokens(), words + [0x5140 + 0x2222 * h, 0x4040 + 0x1111 * j] + lut3, 8)
        for r in range(8):
            ca = (a2 >> 2 * r) & 3 | ((a1 >> r) & 1) << 2
            cb = (b2 >> 2 * r) & 3 | ((b1 >> r) & 1) << 2
            expect = want[ca] | want[cb] << 16
            assert outs[r] == expect, f"dim {r} of {(a2, b2, a1, b1)}: {outs[r]:#010x} != {expect:#010x}"


def _f16(x: int) -> int:
    return int(torch.tensor([float(x)], dtype=torch.float16).view(torch.int16)) & 0xFFFF


def _int8_words(rng) -> list[int]:
    return [rng.getrandbits(32) for _ in range(4)]


def _codes(word: int) -> list[int]:
    return [((word >> 8 * i) & 0xFF) - 256 * (((word >> 8 * i) & 0xFF) >= 128) for i in range(4)]


def test_int8_conversions_give_the_codes_as_f16():
    m64 = LUT[mma_lut.LUT_ZEROS_AT.value - 1]
    rng = random.Random(3)
    cases = [_int8_words(rng) for _ in range(200)]
    # every code value (-127..127; -128 is never stored but converts too) in every byte
    cases += [[sum(((c + k) % 256) << 8 * i for i in range(4)) for k in range(0, 16, 4)] for c in range(0, 256, 16)]
    for w in cases:
        outs = _run(mma_ptx._ptx_int8_one_token(), [w[0], w[1], m64], 4)
        dims = _codes(w[0]) + _codes(w[1])
        for p in range(4):
            expect = _f16(dims[2 * p]) | _f16(dims[2 * p + 1]) << 16
            assert outs[p] == expect, f"pair {p} of {w[:2]}: {outs[p]:#010x} != {expect:#010x}"
        outs = _run(mma_ptx._ptx_int8_two_tokens(), w + [m64], 8)
        a, b = _codes(w[0]) + _codes(w[1]), _codes(w[2]) + _codes(w[3])
        for r in range(8):
            expect = _f16(a[r]) | _f16(b[r]) << 16
            assert outs[r] == expect, f"dim {r} of {w}: {outs[r]:#010x} != {expect:#010x}"


def test_three_bit_lookup_with_table_operands_equals_levels_ptx():
    from sglang_ext.kernels import levels_ptx

    lut3 = LUT[len(mma_ptx.LUT_NAMES):]
    rng = random.Random(1)
    for _ in range(300):
        w2, w1 = rng.getrandbits(32), rng.getrandbits(16)
        assert _run(mma_ptx._ptx_3bit_planes(), [w2, w1] + lut3, 8) == _run(levels_ptx.PTX_3BIT_PLANES.value,
                                                                               [w2, w1], 8)


def test_int8_score_levels_are_the_codebook_s_exactly():
    for bits in (3, 4):
        step, u = mma_ptx.q8_table(bits)
        assert len(u) == len(LEVELS[bits]) and all(0 <= x < 128 for x in u)  # prmt's sign-replicate zeroes them
        assert all(u[c] + u[len(u) - 1 - c] == 127 for c in range(len(u)))  # -L -> 127 - u(L)
        assert tuple((x - mma_ptx.Q8_BIAS) * step for x in u) == LEVELS[bits]


def test_int8_score_lookups_give_the_7_bit_levels():
    _, u4 = mma_ptx.q8_table(4)
    _, u3 = mma_ptx.q8_table(3)
    lut8 = [w & 0xFFFFFFFF for w in mma_ptx.q8_lut_words()]
    rng = random.Random(3)
    words = [rng.getrandbits(32) for _ in range(500)] + [sum(c << (4 * r) for r in range(8)) for c in range(16)]
    words += [sum(((c + r) % 16) << (4 * r) for r in range(8)) for c in range(16)]  # every code in every dim
    for w in words:  # 4-bit: nibble r is dim r; output 0 holds dims 0..3 as bytes, output 1 dims 4..7
        outs = _run(mma_ptx._ptx_k4_q8(), [w] + lut8[:4], 2)
        got = [(outs[r // 4] >> (8 * (r % 4))) & 0xFF for r in range(8)]
        assert got == [u4[(w >> (4 * r)) & 15] for r in range(8)], hex(w)
    dims = ((0, 2, 4, 6), (8, 10, 12, 14), (1, 3, 5, 7), (9, 11, 13, 15))
    cases = [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(500)]
    cases += [(sum((c & 3) << (2 * j) for j in range(16)), 0xFFFF * (c >> 2)) for c in range(8)]
    for w2, w1 in cases:  # 3-bit: the planes' 16 dims; bits above the 1-bit plane's 16 are ignored
        outs = _run(mma_ptx._ptx_k3_q8(), [w2, w1] + lut8[4:], 4)
        for c in range(4):
            got = [(outs[c] >> (8 * e)) & 0xFF for e in range(4)]
            assert got == [u3[((w2 >> (2 * d)) & 3) | (((w1 >> d) & 1) << 2)] for d in dims[c]], (hex(w2), c)


def test_scope_errors_name_what_is_supported(device):
    q = torch.zeros(1, 8, 64, device=device)
    fmt = get_format("octave_k3v3", 64)
    planes = fmt.allocate(4, 1, device)
    ip = torch.tensor([0, 1], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="only octave_k3v4 / octave_k3v3 at head_dim 128"):
        decode_attention(fmt, q, planes, torch.empty_like(q), ip, ip[:1], 0.1, stage1="mma")
    with pytest.raises(ValueError, match="stage1 must be"):
        decode_attention(fmt, q, planes, torch.empty_like(q), ip, ip[:1], 0.1, stage1="gluon")
    if device == "cpu":
        fmt = get_format("octave_k3v4", 128)
        q = torch.zeros(1, 8, 128)
        with pytest.raises(ValueError, match="NVIDIA GPU"):
            decode_attention(fmt, q, fmt.allocate(4, 1, "cpu"), torch.empty_like(q), ip, ip[:1], 0.1, stage1="mma")


@pytest.mark.parametrize("name", ["octave_k3v4", "octave_k3v3", "int8"])
@pytest.mark.parametrize("head_dim,group,h_kv", [(128, 8, 2), (128, 3, 1), (256, 8, 1), (256, 5, 2)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("given_splits", [False, True])
@pytest.mark.parametrize("opts", [{}, {"qk8": False, "lazy": False}, {"qk8": True}],
                         ids=["default", "eager-rescale", "int8-scores"])
def test_mma_decode_matches_reference(name, head_dim, group, h_kv, page_size, given_splits, opts, device):
    """The default octave path (launch_table.MMA_QK8 / MMA_LAZY / MMA_LAZY_QK8: int8 scores at d128, bf16 at d256), bf16
    scores with the eager rescale, and int8 scores everywhere."""
    if device != "cuda":
        pytest.skip("a Gluon kernel: runs on an NVIDIA GPU only (TRITON_INTERPRET=0)")
    if opts and name == "int8":
        pytest.skip("the score options are octave's")
    fmt = get_format(name, head_dim, 64 if head_dim == 256 else None)
    if name == "int8" and head_dim == 128 and group == 3:
        fmt, head_dim = get_format("int8", 64), 64  # int8 covers head_dim 64 too
    gen = torch.Generator().manual_seed(head_dim + group + page_size)
    lengths = [70, 0, 5, 1000, 33, 2100]
    slots = allocate_slots(lengths, page_size, num_pages=-(-sum(lengths) // page_size) + len(lengths) + 8, gen=gen)
    planes = fmt.allocate((-(-sum(lengths) // page_size) + len(lengths) + 8) * page_size, h_kv, device)
    flat = torch.cat(slots).to(device)
    k = torch.randn(flat.numel(), h_kv, head_dim, generator=gen) * 2
    k[:, :, 1] += 6.0  # an outlier channel
    v = torch.randn(flat.numel(), h_kv, head_dim, generator=gen)
    store_kv(fmt, planes, flat, k.to(device, torch.bfloat16), v.to(device, torch.bfloat16))
    ip = indptr(lengths, device)
    q = torch.randn(len(lengths), h_kv * group, head_dim, generator=gen).to(device=device, dtype=torch.bfloat16)
    o = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=device)
    kw = {"num_kv_splits": torch.tensor([4, 1, 2, 3, 1, 4], dtype=torch.int32, device=device),
          "max_kv_splits": 4} if given_splits else {}
    decode_attention(fmt, q, planes, o, ip, flat, head_dim ** -0.5, page_size=page_size, stage1="mma", **opts, **kw)
    ref = reference.decode_attention(fmt, q, planes, ip, flat, head_dim ** -0.5)
    assert not torch.isnan(o).any(), "output elements left unwritten"
    assert not o[1].float().any(), "a request without KV must get zeros"
    err = ((o.float() - ref).norm() / ref.norm()).item()
    print(f"{name} d{head_dim} group {group} {opts}: relative error {err:.2e}")
    # measured on the H200: bf16 scores 3.7e-3 to 4.8e-3, int8 scores 2.6e-3 to 3.3e-3
    assert err < 1e-2, f"relative error {err:.2e} against the reference"


def test_int8_default_takes_the_gluon_kernel_for_long_requests_only(device):
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the default choice of an NVIDIA GPU of compute capability 9")
    from sglang_ext.kernels import decode
    from sglang_ext.kernels.decode_plan import plan_decode
    from sglang_ext.kernels.launch_table import MMA_INT8_MIN_TOKENS

    fmt = get_format("int8", 128)
    for length, stage1 in ((MMA_INT8_MIN_TOKENS - 32, "triton"), (MMA_INT8_MIN_TOKENS, "mma")):
        planes = fmt.allocate(2 * length, 1, device)
        gen = torch.Generator(device=device).manual_seed(length)
        store_kv(fmt, planes, torch.arange(2 * length, device=device),
                 torch.randn(2 * length, 1, 128, device=device, generator=gen),
                 torch.randn(2 * length, 1, 128, device=device, generator=gen))
        ip = torch.tensor([0, length, 2 * length], dtype=torch.int32, device=device)
        idx = torch.arange(2 * length, device=device)
        q = torch.randn(2, 8, 128, device=device, generator=gen).to(torch.bfloat16)
        plan = plan_decode(fmt, planes, batch=2, num_q_heads=8, q_dtype=q.dtype, seq_lens_sum=2 * length)
        assert plan.stage1 == stage1, (length, plan.stage1)
        o = decode.run_decode(plan, fmt, q, planes, torch.empty_like(q), ip, idx, 0.1)
        ref = reference.decode_attention(fmt, q.float(), planes, ip, idx, 0.1)
        err = ((o.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"{stage1} at {length} tokens: relative error {err}"
