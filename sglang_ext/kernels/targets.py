"""Ahead-of-time compile every kernel for the GPU targets we claim, without a GPU:

    python -m sglang_ext.kernels.targets [--target cuda:80 ...] [--group sglang-ext|sglang ...] [--json]

Targets: cuda sm_80 (A100), sm_86 (RTX 30xx / A10), sm_90 (H100 / H200) and hip gfx1100 (RDNA3). Groups:
"sglang-ext", the kernels of this package, each compiled in every variant the launchers use (per format kind and
head_dim layout) through triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget(...)); "sglang",
SGLang's own Triton kernels on the portable_gpu platform's served paths, listed outside this package's core
(GROUPS names the module; it imports SGLang). Prints a table with a summary per group and target; exits 1 if any
compile failed. Must run with TRITON_INTERPRET unset (the interpreter replaces the JIT functions).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass

TARGETS = {"cuda:80": ("cuda", 80, 32), "cuda:86": ("cuda", 86, 32), "cuda:90": ("cuda", 90, 32),
           "hip:gfx1100": ("hip", "gfx1100", 32)}


@dataclass(frozen=True)
class C:
    """A constexpr argument's value; a dict gives one value per backend ("cuda", "hip")."""
    value: object


@dataclass(frozen=True)
class PerTarget:
    """A compile option's value per target name (TARGETS' keys); targets not listed compile without the option."""
    values: dict


def _qsa_gather_variants():
    """qwen4_exp's QSA packers over a compressed layer (qsa_gather.py), per format: the decode / verify gather into
    bf16 buffers (SGLang's packed scratch in the query dtype), compact and page-strided with zero fill, and the
    prefix-extend pack (int8: dequant.py's kernel; octave: the un-rotating one), at head_dim 128 (full RoPE) and
    256 (qwen4_exp: rotary 64), with the launchers' compile options."""
    from ..kvformats import get_format
    from . import decode, dequant, qsa_gather

    i32 = "i32"
    strides = ("stride_kc_slot", "stride_kc_head", "stride_ks_slot", "stride_ks_head", "stride_vc_slot",
               "stride_vc_head", "stride_vs_slot", "stride_vs_head", "stride_ok_n", "stride_ok_h", "stride_ov_n",
               "stride_ov_h")
    out = []
    for name, codes, scales in (("int8", "*i8", "*fp32"), ("octave_k3v4", "*u8", "*fp16"),
                                ("octave_k3v3", "*u8", "*fp16")):
        for d in (128, 256):
            kind, k_n4, v_n4 = decode.layout(get_format(name, d, 64 if d == 256 else None))
            planes = {"k_codes": codes, "k_scales": scales, "v_codes": codes, "v_scales": scales,
                      "k_signs": "*fp32", "v_signs": "*fp32"}
            for zero_fill in (False, True):
                args = {**planes, "req_to_token": "*i32", "req_indices": "*i64", "indices": "*i32",
                        "seq_lens": "*i32", "cu_k": "*i32", "out_k": "*bf16", "out_v": "*bf16"}
                args.update({s: i32 for s in ("topk", "pad_cols", "req_stride", "idx_stride", *strides)})
                args.update({"FMT": C(kind), "K_N4": C(k_n4), "V_N4": C(v_n4), "NB": C(d // 64),
                             "BLOCK_N": C(qsa_gather.GATHER_BLOCK_N), "LUT": C(decode.LUT_SELECT),
                             "ZERO_FILL": C(zero_fill)})
                out.append((f"qsa_gather selected {name} d{d}" + (" zero_fill" if zero_fill else ""),
                            qsa_gather._gather_selected_kernel, args, dict(qsa_gather.GATHER_COMPILE_OPTIONS)))
            # the prefix-extend pack (and the no-prefix extend's stored K/V) into bf16 buffers at int64 slots
            if kind == 2:
                out.append((f"qsa_gather prefill {name} d{d}", qsa_gather._octave_plain_kernel, {
                    **planes, "loc_ptr": "*i64", "out_k": "*bf16", "out_v": "*bf16", "num_rows": i32,
                    **{s: i32 for s in strides}, "K_N4": C(k_n4), "V_N4": C(v_n4), "NB": C(d // 64),
                    "BLOCK_N": C(qsa_gather.PLAIN_BLOCK_N)}, dict(qsa_gather.GATHER_COMPILE_OPTIONS)))
            else:  # dequant.py's kernel, no device-side limit
                out.append((f"qsa_gather prefill {name} d{d}", dequant._dequant_kernel, {
                    "codes": codes, "scales": scales, "loc_ptr": "*i64", "out_ptr": "*bf16", "num_tokens": i32,
                    "limit_ptr": "*i64", "head_base": i32, "stride_c_slot": i32, "stride_c_head": i32,
                    "stride_s_slot": i32, "stride_s_head": i32, "stride_o_n": i32, "stride_o_h": i32, "FMT": C(kind),
                    "N4": C(0), "NB": C(d // 64), "BLOCK_N": C(dequant.ROTATED_BLOCK_N), "LUT": C(decode.LUT_SELECT),
                    "LIMIT_FROM_PTR": C(False)}, {}))
    return out


def _variants():
    """(label, jit function, {arg name: type string or C(value)}, compile options) for every kernel variant, with
    the options the launchers use."""
    from . import decode, dequant, extend, launch_table, rotate, store

    p32, p16, pb16, pu8, pi8, pi32 = "*fp32", "*fp16", "*bf16", "*u8", "*i8", "*i32"
    ptx = {"cuda": decode.LUT_PTX, "hip": decode.LUT_SELECT}  # the launchers' level decode per backend
    i32, f32 = "i32", "fp32"
    # per format kind: (codes ptr, scales ptr, K leading 4-bit blocks, V leading 4-bit blocks) at D 256 / rotary 64
    kinds = {
        "bf16": (0, pb16, p32, 0, 0),
        "int8": (1, pi8, p32, 0, 0),
        "octave_k3v4": (2, pu8, p16, 1, 4),
        "octave_k3v3": (2, pu8, p16, 1, 0),
    }
    out = [("rotate_rows", rotate._rotate_rows_kernel, {
        "x_ptr": pb16, "out_ptr": p32, "mat_ptr": p32, "num_rows": i32, "rows_per_outer": i32, "stride_x_outer": i32,
        "stride_x_inner": i32, "stride_o_outer": i32, "stride_o_inner": i32, "NB": C(4), "BLOCK_R": C(16)}, {})]
    for name, (fmt, codes, scales, k_n4, v_n4) in kinds.items():
        for d in (128, 256):
            kn4 = min(k_n4, d // 64) if d == 256 else (d // 64 if fmt == 2 else 0)
            vn4 = (d // 64 if v_n4 else 0) if fmt == 2 else 0
            tag = f"{name} d{d}"
            out.append((f"store {tag}", store._store_kernel, {
                "x_ptr": pb16, "loc_ptr": pi32, "codes_ptr": codes, "scales_ptr": scales, "sign_ptr": p32, "thr_ptr": p32,
                "level_ptr": p32, "num_tokens": i32, "stride_x_n": i32, "stride_x_h": i32, "stride_c_slot": i32,
                "stride_c_head": i32, "stride_s_slot": i32, "stride_s_head": i32,
                "FMT": C(fmt), "D": C(d), "N4": C(kn4), "NB": C(d // 64),
                "BLOCK_N": C(store.default_launch(name, d)[0])},
                {**store.STORE_COMPILE_OPTIONS, "num_warps": store.default_launch(name, d)[1]}))
            common = {"k_codes": codes, "k_scales": scales, "v_codes": codes, "v_scales": scales}
            strides = {s: i32 for s in ("stride_kc_slot", "stride_kc_head", "stride_ks_slot", "stride_ks_head",
                                        "stride_vc_slot", "stride_vc_head", "stride_vs_slot", "stride_vs_head")}
            # decode; at d128 also the chain- and tree-verify variants (4 tokens per request: decode_attention's q_len,
            # tree_mask); and the launch of launch_table.TRITON_LAUNCH (the default on sm_90 for groups of at most 8),
            # for every target
            launches = [(q_len, "", {}) for q_len in ((1, 4) if d == 128 else (1,))]
            if d == 128:
                launches.append((4, " tree", {}))
            if (launch_table.SM90, name, d) in launch_table.TRITON_LAUNCH:
                launches.append((1, " launch", launch_table.at(launch_table.TRITON_LAUNCH, launch_table.SM90, name, d)))
            for q_len, suffix, launch in launches:
                out.append((f"decode_stage1 {tag}" + (f" verify q_len {q_len}" if q_len > 1 else "") + suffix,
                            decode._decode_stage1, dict(
                    q_ptr=p32, **common, kv_indptr=pi32, kv_indices=pi32, num_kv_splits=pi32, mid_o=p32,
                    mid_lse=p32, sm_scale=f32, new_slots="*i64", tree_bits=pi32, **strides, stride_q_b=i32,
                    stride_q_h=i32, stride_mo_b=i32, stride_mo_h=i32, stride_mo_s=i32, stride_ml_b=i32, stride_ml_h=i32,
                    FMT=C(fmt), GROUP=C(8), BLOCK_H=C(max(launch.get("min_rows", 16), 8 * q_len)),
                    BLOCK_N=C(launch.get("block_n", decode.default_block_n(name, d))), MIN_BLOCK=C(32), K_N4=C(kn4),
                    V_N4=C(vn4), NB=C(d // 64), LOGIT_CAP=C(0.0), DOT_BF16=C(True), LUT=C(ptx),
                    I8_F16=C({"cuda": launch_table.at(launch_table.INT8_F16_MODE, launch_table.NVIDIA, name, d,
                                                      decode.I8_F16_BOTH) if fmt == 1
                              else decode.I8_FLOAT32, "hip": decode.I8_FLOAT32}),
                    Q_LEN=C(q_len), BLOCK_T=C(16), KV_A=C(launch.get("kv_a", False)), TREE=C(suffix == " tree")),
                    {"num_warps": launch.get("num_warps", 4), "num_stages": launch.get("num_stages"),
                     "maxnreg": PerTarget({"cuda:90": launch_table.at(launch_table.OCTAVE_MAXNREG, launch_table.SM90,
                                                                      name, d)} if fmt == 2 and q_len == 1 and not launch
                                          else {})}))
            # the causal extend everywhere; speculative verify (SGLang's custom tree mask, the new tokens read
            # back from the pool at new_slots) for one format
            for mask in (False, True) if name == "octave_k3v4" and d == 128 else (False,):
                out.append((f"extend {tag}" + (" custom-mask" if mask else ""), extend._extend_kernel, dict(
                    q_ptr=p32, ke_ptr=p32, ve_ptr=p32, out_ptr=p32, **common, qo_indptr=pi32, kv_indptr=pi32,
                    kv_indices=pi32, custom_mask=pu8, mask_indptr=pi32, new_slots="*i64", sm_scale=f32,
                    stride_q_t=i32, stride_q_h=i32, stride_ke_t=i32, stride_ke_h=i32, stride_ve_t=i32, stride_ve_h=i32,
                    stride_o_t=i32, stride_o_h=i32, **strides,
                    FMT=C(fmt), GROUP=C(8), BLOCK_G=C(8), BLOCK_M=C(extend.default_launch(name, d)["rows_per_program"] // 8),
                    BLOCK_N=C(extend.default_launch(name, d)["block_n"]), K_N4=C(kn4), V_N4=C(vn4), NB=C(d // 64), IS_CAUSAL=C(not mask),
                    USE_CUSTOM_MASK=C(mask), NEW_FROM_POOL=C(mask), LOGIT_CAP=C(0.0), DOT_BF16=C(True),
                    LUT=C(ptx)), {"num_warps": 8}))
            dq = {"codes": codes, "scales": scales, "num_tokens": i32, "head_base": i32, "stride_c_slot": i32,
                  "stride_c_head": i32, "stride_s_slot": i32, "stride_s_head": i32, "stride_o_n": i32,
                  "stride_o_h": i32, "FMT": C(fmt), "N4": C(kn4), "NB": C(d // 64)}
            out.append((f"dequant {tag}", dequant._dequant_kernel, {
                **dq, "loc_ptr": pi32, "limit_ptr": pi32, "out_ptr": p32, "BLOCK_N": C(16),
                "LUT": C(decode.LUT_SELECT), "LIMIT_FROM_PTR": C(False)}, {}))
            if fmt != 0:  # extend's prefix scratch: bf16, rotated basis, SGLang's int64 kv_indices
                out.append((f"dequant rotated {tag}", dequant._dequant_kernel, {
                    **dq, "loc_ptr": "*i64", "limit_ptr": pi32, "out_ptr": pb16,
                    "BLOCK_N": C(dequant.ROTATED_BLOCK_N), "LUT": C(ptx), "LIMIT_FROM_PTR": C(True)}, {}))
    out.extend(_qsa_gather_variants())
    out.extend(_mma_variants())
    out.extend(_spec_variants())
    out.extend(_host_transfer_variants())
    # stage 2, plain (int8, bf16) and un-rotating the octave output (UNROTATE)
    for unrotate in (False, True):
        out.append(("decode_stage2 d256" + (" unrotate" if unrotate else ""), decode._decode_stage2, {
            "mid_o": p32, "mid_lse": p32, "out_ptr": pb16, "kv_indptr": pi32, "num_kv_splits": pi32, "sign_ptr": p32,
            "stride_mo_b": i32, "stride_mo_h": i32, "stride_mo_s": i32, "stride_ml_b": i32, "stride_ml_h": i32,
            "stride_o_b": i32, "stride_o_h": i32, "D": C(256), "MAX_SPLITS": C(16), "SPLITS_P2": C(16), "MIN_BLOCK": C(32), "Q_LEN": C(1),
            "SPLIT_MUL": C(1), "UNROTATE": C(unrotate)}, {}))
    return out


def _mma_variants():
    """decode_mma's Gluon stage 1 (octave_k3v4 and octave_k3v3 at head_dim 128 and 256; int8 at 64, 128 and 256),
    NVIDIA targets only:
    mma.sync and movmatrix have no RDNA3 counterpart, and there decode runs decode._decode_stage1."""
    from . import decode, launch_table, mma_int8, mma_octave, mma_ptx

    t = launch_table

    i32 = "i32"
    strides = {s: i32 for s in ("stride_kc_slot", "stride_kc_head", "stride_ks_slot", "stride_ks_head",
                                "stride_vc_slot", "stride_vc_head", "stride_vs_slot", "stride_vs_head", "stride_q_b",
                                "stride_q_h", "stride_mo_b", "stride_mo_h", "stride_mo_s", "stride_ml_b", "stride_ml_h")}
    return [(f"decode_stage1_mma octave_k3v{3 if v3 else 4} d{d} n{n}" + (" qk8" if q8 else "")
             + (" lazy" if lazy else ""), mma_octave._decode_stage1_mma, dict(
        q_ptr="*fp32", k_codes="*u8", k_scales="*fp16", v_codes="*u8", v_scales="*fp16", kv_indptr="*i32",
        kv_indices="*i64", num_kv_splits="*i32", mid_o="*fp32", mid_lse="*fp32", sm_scale="fp32", lut_ptr="*i32",
        **strides, GROUP=C(8), BLOCK_N=C(n), MIN_BLOCK=C(decode.MIN_BLOCK_KV), WIDE=C(False), D256=C(d == 256),
        SPLIT_MUL=C(1), V3=C(v3), Q8=C(q8), STEP4=C(mma_ptx.q8_table(4)[0]),
        STEP3=C(mma_ptx.q8_table(3)[0]), LAZY=C(lazy)), {"num_warps": 1, BACKENDS: ("cuda",)})
        for v3 in (False, True) for d in (128, 256) for n in (16, 32) for name in [f"octave_k3v{3 if v3 else 4}"]
        # bf16 scores, eager and lazy where launch_table.MMA_LAZY has it; int8 scores at the default n, lazy where
        # launch_table.MMA_LAZY_QK8 has it
        for q8, lazy in ((False, False), (False, True), (True, t.at(t.MMA_LAZY_QK8, t.NVIDIA, name, d, False)))
        if (not lazy or t.at(t.MMA_LAZY, t.NVIDIA, name, d, False))
        and (not q8 or n == t.at(t.MMA_BLOCK_N, t.NVIDIA, name, d))] + [
        (f"decode_stage1_mma int8 d{d} n{n}", mma_int8._decode_stage1_mma_int8, dict(
            q_ptr="*bf16", k_codes="*i8", k_scales="*fp32", v_codes="*i8", v_scales="*fp32", kv_indptr="*i32",
            kv_indices="*i64", num_kv_splits="*i32", mid_o="*fp32", mid_lse="*fp32", sm_scale="fp32", lut_ptr="*i32",
            **strides, GROUP=C(8), BLOCK_N=C(n), MIN_BLOCK=C(decode.MIN_BLOCK_KV), WIDE=C(False), NB=C(d // 64),
            SPLIT_MUL=C(1)), {"num_warps": 1, BACKENDS: ("cuda",)})
        for d in (64, 128, 256) for n in (16, 32)]


# Variant groups. A group other than ours is "module:function"; the function takes (target name, the --only strings)
# and returns [(label, compile thunk or None, why skipped)] for the labels that contain one of them (all when none).
# It is loaded only when the group is asked for, so importing this module never imports SGLang.
OURS = "sglang-ext"
GROUPS = {OURS: None, "sglang": "sglang_ext.platform.sglang_triton_targets:compile_jobs"}

BACKENDS = "_backends"  # a variant's options key: the backends it is built for (others are listed as skipped)


def _host_transfer_variants():
    """HiCache host <-> device row copies: 8-byte words (bf16/int8 code rows) and 2-byte words (fp16 scale rows)."""
    from . import host_transfer

    i32 = "i32"
    out = []
    for word, row_words, rows, block in (("i64", 128, 16, 128), ("i16", 8, 64, 8)):
        out.append((f"host_transfer copy_rows {word} x{row_words}", host_transfer._copy_rows_kernel, {
            "src_ptr": f"*{word}", "dst_ptr": f"*{word}", "src_idx_ptr": "*i64", "dst_idx_ptr": "*i64", "n_rows": i32,
            "src_page": i32, "src_page_stride": "i64", "src_row_stride": "i64", "src_base": "i64",
            "dst_page": i32, "dst_page_stride": "i64", "dst_row_stride": "i64", "dst_base": "i64",
            "ROW_WORDS": C(row_words), "ROWS": C(rows), "BLOCK": C(block)}, {}))
    return out


def _spec_variants():
    """Speculative-decoding kernels: n = 4 (MTP, 3 steps) and 8 (NGRAM, EAGLE topk 4) draft tokens per request."""
    from . import spec_cache_locs, spec_sampling, spec_tree

    pb, pi32, pi64, i32 = "*i1", "*i32", "*i64", "i32"
    out = []
    for n in (4, 8):
        out.append((f"spec reconstruct_tree n{n}", spec_tree._reconstruct_tree_kernel, {
            "mask_ptr": pb, "seq_len_ptr": pi64, "positions_ptr": pi64, "retrieve_index_ptr": pi64,
            "next_token_ptr": pi64, "next_sibling_ptr": pi64, "N": C(n), "BLOCK_N": C(n)}, {}))
        out.append((f"spec verify_tree_greedy n{n}", spec_tree._verify_tree_greedy_kernel, {
            "predicts_ptr": pi32, "accept_index_ptr": pi32, "accept_num_ptr": pi32, "candidates_ptr": pi64,
            "retrieve_index_ptr": pi64, "next_token_ptr": pi64, "next_sibling_ptr": pi64, "target_ptr": pi64,
            "STEPS": C(n), "N": C(n)}, {}))
        out.append((f"spec tree_sampling n{n}", spec_sampling._tree_sampling_kernel, {
            "predicts_ptr": pi32, "accept_index_ptr": pi32, "accept_num_ptr": pi32, "candidates_ptr": pi64,
            "retrieve_index_ptr": pi64, "next_token_ptr": pi64, "next_sibling_ptr": pi64, "coins_ptr": "*fp32",
            "final_coins_ptr": "*fp32", "target_ptr": "*fp32", "draft_ptr": "*fp32", "vocab": i32,
            "threshold_single": "fp32", "threshold_acc": "fp32", "STEPS": C(n), "N": C(n), "BLOCK_V": C(1024)}, {}))
    for topk, depth, n, full in ((1, 4, 4, True), (4, 4, 8, True), (4, 4, 8, False)):
        out.append((f"spec build_tree topk{topk} n{n} {'full' if full else 'qlen'}", spec_tree._build_tree_kernel, {
            "parent_list_ptr": pi64, "selected_ptr": pi64, "seq_len_ptr": pi64, "prefix_ptr": pi64, "mask_ptr": pb,
            "positions_ptr": pi64, "retrieve_index_ptr": pi64, "next_token_ptr": pi64, "next_sibling_ptr": pi64,
            "parent_stride": i32, "selected_stride": i32, "TOPK": C(topk), "DEPTH": C(depth), "N": C(n),
            "BLOCK_N": C(n), "FULL_MASK": C(full)}, {}))
    out.append(("spec assign_extend_cache_locs", spec_cache_locs._assign_extend_cache_locs_kernel, {
        "req_ptr": pi64, "table_ptr": pi32, "start_ptr": pi64, "end_ptr": pi64, "out_ptr": pi64,
        "out_start_ptr": pi64, "stride_table": i32, "BLOCK": C(32)}, {}))
    out.append(("spec fill_accept_out_cache_loc", spec_cache_locs._fill_accept_out_cache_loc_kernel, {
        "accept_ptr": pi32, "loc_ptr": pi64, "out_ptr": pi64, "SIZE_UPPER": C(32)}, {}))
    return out


def compile_one(fn, spec: dict, target, options: dict | None = None, target_name: str = "") -> None:
    import triton
    from triton.compiler import ASTSource

    options = {k: (v.values.get(target_name) if isinstance(v, PerTarget) else v) for k, v in (options or {}).items()
               if k != BACKENDS}
    options = {k: v for k, v in options.items() if v is not None}
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    missing = set(fn.arg_names) - set(spec)
    assert not missing, f"{fn.__name__}: no type for {sorted(missing)}"
    signature = {a: ("constexpr" if isinstance(spec[a], C) else spec[a]) for a in fn.arg_names}
    constexprs = {a: spec[a].value for a in fn.arg_names if isinstance(spec[a], C)}
    constexprs = {a: (v[target.backend] if isinstance(v, dict) else v) for a, v in constexprs.items()}
    triton.compile(ASTSource(fn, signature, constexprs), target=target, options=options or None)


def _our_jobs(tname: str, only: tuple[str, ...]) -> list:
    """[(label, compile thunk or None, why skipped)] of this package's variants for one target."""
    from triton.backends.compiler import GPUTarget

    jobs = []
    for label, fn, spec, options in _variants():
        if not selected(label, only):
            continue
        if TARGETS[tname][0] not in options.get(BACKENDS, (TARGETS[tname][0],)):
            jobs.append((label, None, f"built for {', '.join(options[BACKENDS])} only"))
            continue
        jobs.append((label, lambda fn=fn, spec=spec, options=options: compile_one(
            fn, spec, GPUTarget(*TARGETS[tname]), options, tname), ""))
    return jobs


def selected(label: str, only: tuple[str, ...]) -> bool:
    """Whether --only (no strings: everything) selects a variant label."""
    return not only or any(o in label for o in only)


def _group_jobs(group: str):
    if GROUPS[group] is None:
        return _our_jobs
    module, _, function = GROUPS[group].partition(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_ext.kernels.targets", description=__doc__)
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="default: all")
    ap.add_argument("--group", action="append", choices=list(GROUPS), help="default: all")
    ap.add_argument("--only", action="append", default=[],
                    help="compile only variants whose label contains this (repeatable: any of them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("error: unset TRITON_INTERPRET (the interpreter replaces the kernels' JIT functions)", file=sys.stderr)
        return 2

    targets = args.target or list(TARGETS)
    rows = []
    for group in args.group or list(GROUPS):
        jobs_for = _group_jobs(group)
        for tname in targets:
            for label, compile_it, skipped in jobs_for(tname, tuple(args.only)):
                if compile_it is None:
                    if not args.json:
                        print(f"{label:<32} {tname:<12} skipped ({skipped})")
                    continue
                t0 = time.time()
                try:
                    compile_it()
                    status = "ok"
                except Exception as e:  # noqa: BLE001 - every failure is reported in the table and the exit code
                    status = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                rows.append({"group": group, "kernel": label, "target": tname, "status": status,
                             "seconds": round(time.time() - t0, 2)})
                if not args.json:
                    print(f"{label:<32} {tname:<12} {status:<6} {rows[-1]['seconds']:>6.2f}s", flush=True)
    failed = [r for r in rows if r["status"] != "ok"]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for group in dict.fromkeys(r["group"] for r in rows):
            for tname in targets:
                mine = [r for r in rows if r["group"] == group and r["target"] == tname]
                bad = sum(r["status"] != "ok" for r in mine)
                if mine:
                    print(f"{group} {tname}: {len(mine) - bad} compiled, {bad} failed")
        print(f"{len(rows) - len(failed)} compiled, {len(failed)} failed")
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
