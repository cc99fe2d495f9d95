"""Correctness checks run before any timing in kernels_bench.py (GPU, or CPU under TRITON_INTERPRET=1).

Each check poisons the output with NaN, runs one kernel on seeded random data (K with a few outlier
channels, ragged lengths, shuffled slots) and compares with a float32 torch reference:

* ``store``: our store kernel's planes vs the format's torch quantizer (``fmt.quantize``) run on the CPU, bit
  for bit.
* ``decode`` / ``extend``: relative error ||out - ref|| / ||ref|| against two references:
  ``spec`` = attention over the format's own dequantized K/V (``fmt.dequantize``): the kernel's error;
  ``exact`` = attention over the unquantized K/V: the format's (lossy) error plus the kernel's.
  The extend reference uses the new tokens' K/V as given (SGLang semantics); ``spec_q`` also reports the
  error against a reference that quantizes the new tokens too, so either reading can be recognised.
* the SGLang bf16 kernels are checked the same way against ``exact``.
"""

from __future__ import annotations

import math

import torch

# kernel-vs-spec thresholds: bf16 operands land between 1e-3 and 1e-2 (METHOD.md); fp32 far lower
SPEC_REL_ERR_MAX = 2e-2


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


LAST_PHASE = {"phase": ""}  # which kernel check_format was running, for the error line when one raises


def _enter(res: dict, phase: str) -> None:
    res["phase"] = LAST_PHASE["phase"] = phase


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want|: relative to |want| for float planes (scales), in code units for integer planes
    (for packed planes a byte, i.e. up to 2-4 codes)."""
    if got.is_floating_point():
        g, w = got.double(), want.double()
        return float(((g - w).abs() / w.abs().clamp_min(1e-30)).max()) if g.numel() else 0.0
    return float((got.int() - want.int()).abs().max()) if got.numel() else 0.0


def ref_attention(q, k, v, sm_scale, prefix_len=None):
    """q [n, Hq, D], k/v [t, Hkv, D] -> float32 [n, Hq, D]. Causal with query i at position prefix_len + i
    when prefix_len is given (extend), else every query sees all t keys (decode, n == 1)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, 1)
    v = v.float().repeat_interleave(group, 1)
    s = torch.einsum("nhd,thd->hnt", q.float(), k) * sm_scale
    if prefix_len is not None:
        n, t = q.shape[0], k.shape[0]
        allowed = torch.arange(t, device=q.device)[None, :] <= (prefix_len + torch.arange(n, device=q.device))[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hnt,thd->nhd", s.softmax(-1), v)


def random_kv(n, h, d, dtype, device, gen):
    """K with 4 outlier channels (x8) as real K caches have; V plain Gaussian."""
    k = torch.randn(n, h, d, generator=gen, device=device, dtype=torch.float32)
    k[..., torch.tensor([1, 17, d // 2 + 3, d - 2])] *= 8.0
    v = torch.randn(n, h, d, generator=gen, device=device, dtype=torch.float32)
    return k.to(dtype), v.to(dtype)


def _layout(lens, device, gen, spare=7):
    """Shuffled distinct slots for ragged lens: (indptr int32 [B+1], indices int64, num_slots)."""
    lens_t = torch.tensor(lens, dtype=torch.int32)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens_t, 0)
    total = int(indptr[-1])
    num_slots = total + spare
    indices = torch.randperm(num_slots, generator=torch.Generator().manual_seed(7))[:total]
    return indptr.to(device), indices.to(device=device, dtype=torch.int64), num_slots


def check_format(fmt, kernels, shape, dtype, device, lens=(1, 77, 1000, 2100), ext=((0, 33), (500, 64), (1300, 1))):
    """Run store/decode/extend of our kernels for `fmt` once and return a dict of measured errors."""
    hq, hkv, d = shape
    gen = torch.Generator(device=device).manual_seed(1234)
    sm_scale = 1.0 / math.sqrt(d)
    res = {"format": fmt.name, "head_dim": d}
    indptr, indices, num_slots = _layout(lens, device, gen)
    k, v = random_kv(len(indices), hkv, d, dtype, device, gen)
    planes = fmt.allocate(num_slots, hkv, device)
    for p in planes.values():
        p.fill_(0x5A if not p.is_floating_point() else float("nan"))
    _enter(res, "store")
    kernels.store_kv(fmt, planes, indices, k, v)
    # the spec is the CPU quantizer: torch's CUDA division by a Python scalar is a multiply by the reciprocal
    want = {name: t.to(device) for name, t in fmt.quantize(k.cpu(), v.cpu()).items()}
    mism = {name: int((planes[name][indices] != want[name]).sum()) for name in want}
    res["store_mismatched_elements"] = mism
    res["store_max_diff"] = {name: _max_diff(planes[name][indices], want[name]) for name in want}
    res["store_ok"] = all(m == 0 for m in mism.values())
    deq_k, deq_v = fmt.dequantize({name: planes[name][indices] for name in planes})

    q = torch.randn(len(lens), hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    o = torch.full_like(q, float("nan"))
    _enter(res, "decode")
    kernels.decode_attention(fmt, q, planes, o, indptr, indices, sm_scale)
    spec = torch.empty(q.shape, dtype=torch.float32, device=device)
    exact = torch.empty_like(spec)
    for b in range(len(lens)):
        s, e = int(indptr[b]), int(indptr[b + 1])
        spec[b] = ref_attention(q[b:b + 1], deq_k[s:e], deq_v[s:e], sm_scale)[0]
        exact[b] = ref_attention(q[b:b + 1], k[s:e], v[s:e], sm_scale)[0]
    res["decode_unwritten"] = int(o.isnan().sum())
    res["decode_rel_err_spec"] = rel_err(o, spec)
    res["decode_rel_err_exact"] = rel_err(o, exact)

    _enter(res, "extend")
    res.update(_check_extend(fmt, kernels, planes, deq_k, deq_v, k, v, indices, ext, shape, dtype, device, gen,
                             sm_scale))
    _enter(res, "done")
    res["ok"] = bool(
        res["store_ok"] and res["decode_unwritten"] == 0 and res["extend_unwritten"] == 0
        and res["decode_rel_err_spec"] < SPEC_REL_ERR_MAX
        and min(res["extend_rel_err_spec"], res["extend_rel_err_spec_q"]) < SPEC_REL_ERR_MAX
    )
    return res


def _check_extend(fmt, kernels, planes, deq_k, deq_v, k, v, indices, ext, shape, dtype, device, gen, sm_scale):
    """Extend over prefixes taken from the slots stored above; new tokens are fresh."""
    hq, hkv, d = shape
    pre = [p for p, _ in ext]
    new = [n for _, n in ext]
    kv_indptr = torch.zeros(len(ext) + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(pre), 0)
    qo_indptr = torch.zeros(len(ext) + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(new), 0)
    assert int(kv_indptr[-1]) <= len(indices)
    kv_idx = indices[: int(kv_indptr[-1])]
    n_new = int(qo_indptr[-1])
    ke, ve = random_kv(n_new, hkv, d, dtype, device, gen)
    qe = torch.randn(n_new, hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    oe = torch.full_like(qe, float("nan"))
    kernels.extend_attention(fmt, qe, ke, ve, oe, planes, qo_indptr.to(device), kv_indptr.to(device), kv_idx,
                             max(new), sm_scale, is_causal=True)
    qke, qve = fmt.dequantize(fmt.quantize(ke, ve))
    spec, spec_q, exact = (torch.empty(qe.shape, dtype=torch.float32, device=device) for _ in range(3))
    for b in range(len(ext)):
        ps, pe = int(kv_indptr[b]), int(kv_indptr[b + 1])
        qs, qend = int(qo_indptr[b]), int(qo_indptr[b + 1])
        args = (qe[qs:qend],)
        spec[qs:qend] = ref_attention(*args, torch.cat([deq_k[ps:pe], ke[qs:qend].float()]),
                                      torch.cat([deq_v[ps:pe], ve[qs:qend].float()]), sm_scale, pe - ps)
        spec_q[qs:qend] = ref_attention(*args, torch.cat([deq_k[ps:pe], qke[qs:qend]]),
                                        torch.cat([deq_v[ps:pe], qve[qs:qend]]), sm_scale, pe - ps)
        # slot indices[j] holds token j, and batch b's prefix is indices[ps:pe]: its K/V are k[ps:pe]
        exact[qs:qend] = ref_attention(*args, torch.cat([k[ps:pe], ke[qs:qend]]),
                                       torch.cat([v[ps:pe], ve[qs:qend]]), sm_scale, pe - ps)
    return {
        "extend_unwritten": int(oe.isnan().sum()),
        "extend_rel_err_spec": rel_err(oe, spec),
        "extend_rel_err_spec_q": rel_err(oe, spec_q),
        "extend_rel_err_exact": rel_err(oe, exact),
    }


def check_sglang(baseline_decode, baseline_extend, shape, dtype, device, lens=(1, 77, 1000, 2100),
                 ext=((0, 33), (500, 64), (1300, 1))):
    """SGLang's decode/extend on a plain [slots, H, D] buffer vs the exact reference."""
    hq, hkv, d = shape
    gen = torch.Generator(device=device).manual_seed(4321)
    sm_scale = 1.0 / math.sqrt(d)
    indptr, indices, num_slots = _layout(lens, device, gen)
    kb = torch.full((num_slots, hkv, d), float("nan"), dtype=dtype, device=device)
    vb = torch.full_like(kb, float("nan"))
    k, v = random_kv(len(indices), hkv, d, dtype, device, gen)
    kb[indices], vb[indices] = k, v
    q = torch.randn(len(lens), hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    o = torch.full_like(q, float("nan"))
    baseline_decode.plan(torch.tensor(lens, dtype=torch.int32, device=device), hq, hkv, d)
    baseline_decode.run(q, kb, vb, o, indptr, indices, sm_scale)
    bounds = [(int(indptr[b]), int(indptr[b + 1])) for b in range(len(lens))]
    exact = torch.stack([ref_attention(q[b:b + 1], k[s:e], v[s:e], sm_scale)[0] for b, (s, e) in enumerate(bounds)])
    res = {"format": "bf16-sglang", "head_dim": d, "decode_unwritten": int(o.isnan().sum()),
           "decode_rel_err_exact": rel_err(o, exact)}
    pre = [p for p, _ in ext]
    new = [n for _, n in ext]
    kv_indptr = torch.zeros(len(ext) + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(pre), 0)
    qo_indptr = torch.zeros(len(ext) + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(new), 0)
    n_new = int(qo_indptr[-1])
    ke, ve = random_kv(n_new, hkv, d, dtype, device, gen)
    qe = torch.randn(n_new, hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    oe = torch.full_like(qe, float("nan"))
    baseline_extend(qe, ke, ve, oe, kb, vb, qo_indptr.to(device), kv_indptr.to(device),
                    indices[: int(kv_indptr[-1])], max(new), sm_scale)
    exact_e = torch.empty(qe.shape, dtype=torch.float32, device=device)
    for b in range(len(ext)):
        ps, pe = int(kv_indptr[b]), int(kv_indptr[b + 1])
        qs, qend = int(qo_indptr[b]), int(qo_indptr[b + 1])
        exact_e[qs:qend] = ref_attention(qe[qs:qend], torch.cat([k[ps:pe], ke[qs:qend]]),
                                         torch.cat([v[ps:pe], ve[qs:qend]]), sm_scale, pe - ps)
    res["extend_unwritten"] = int(oe.isnan().sum())
    res["extend_rel_err_exact"] = rel_err(oe, exact_e)
    res["ok"] = bool(res["decode_unwritten"] == 0 and res["extend_unwritten"] == 0
                     and res["decode_rel_err_exact"] < SPEC_REL_ERR_MAX
                     and res["extend_rel_err_exact"] < SPEC_REL_ERR_MAX)
    return res
