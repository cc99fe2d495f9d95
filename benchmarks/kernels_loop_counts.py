"""Instructions per KV token and head of each decode stage-1 kernel's main loop, per GPU target, without a GPU:
the instruction side of the roofline in docs/benchmarks/kernels.md's section "Decode at the byte limit".

    # here (no GPU; TRITON_INTERPRET unset): about 2-4 minutes of one core
    .venv/bin/python benchmarks/kernels_loop_counts.py --merge-into docs/benchmarks/kernels-roofline.json

Each variant of sglang_ext.kernels.targets (the launches the planners use) is compiled for sm_90 (H100/H200), sm_86
(RTX 30xx) and gfx1100 (RX 7900 XTX). The main loop is the largest block between a label and a backward branch to
it (SASS from nvdisasm of the cubin; AMDGCN text). Its instructions x warps per program / tokens per iteration =
warp (wave) instructions per KV token and head; per class: integer ALU (prmt/lop3/shifts/v_perm/v_and/...),
FMA-pipe (IMAD/FFMA/FMUL/v_fma/v_mul...), tensor (HMMA/IMMA/v_wmma), memory and other.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# targets' variant labels: the Triton stage 1 as sm_86 / gfx1100 launch it (and " launch": as sm_90 does, its
# launch_table.TRITON_LAUNCH entry), and decode_mma's Gluon stage 1 in the planners' default variants
CASES = [f"decode_stage1 {f} d{d}{s}" for f in ("bf16", "int8", "octave_k3v4", "octave_k3v3") for d in (128, 256)
         for s in ("", " launch")] + [
    "decode_stage1_mma octave_k3v4 d128 n32 qk8 lazy", "decode_stage1_mma octave_k3v3 d128 n32 qk8 lazy",
    "decode_stage1_mma octave_k3v4 d256 n16 lazy", "decode_stage1_mma octave_k3v3 d256 n16",
    "decode_stage1_mma int8 d128 n32", "decode_stage1_mma int8 d256 n16"]
NV_ALU = re.compile(r"^(PRMT|LOP3|SHF|SHL|SHR|IADD3|ISETP|SEL|LEA|BFE|BFI|FLO|POPC|MOV|IABS|IMNMX|VIMNMX|PLOP3|SGXT|I2F|F2I|F2F|I2IP|F2FP)")
NV_FMA = re.compile(r"^(IMAD|FFMA|FMUL|FADD|HFMA2|HMUL2|HADD2|FSEL|FSETP|FMNMX|MUFU|FCHK|DFMA)")
NV_MMA = re.compile(r"^(HMMA|IMMA|MOVM)")
NV_MEM = re.compile(r"^(LDG|LDS|STS|STG|LDGSTS|LDSM|LD\b|ST\b|LDC|ULDC)")
AMD_MMA = re.compile(r"^v_wmma")
AMD_MEM = re.compile(r"^(global_|buffer_|ds_|flat_|scratch_)")
AMD_FMA = re.compile(r"^v_(fma|mul|add_f|sub_f|max_f|min_f|exp|log|rcp|cvt|pk_fma|pk_mul|pk_add|dot|fmac|fmamk|fmaak|mad|ldexp)")


def compile_asm(fn, spec, target, options, tname):
    import triton
    from triton.compiler import ASTSource

    from sglang_ext.kernels import targets as T

    options = {k: (v.values.get(tname) if isinstance(v, T.PerTarget) else v) for k, v in (options or {}).items()
               if k != T.BACKENDS}
    options = {k: v for k, v in options.items() if v is not None}
    src_cls = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as src_cls
    signature = {a: ("constexpr" if isinstance(spec[a], T.C) else spec[a]) for a in fn.arg_names}
    constexprs = {a: spec[a].value for a in fn.arg_names if isinstance(spec[a], T.C)}
    constexprs = {a: (v[target.backend] if isinstance(v, dict) else v) for a, v in constexprs.items()}
    return triton.compile(src_cls(fn, signature, constexprs), target=target, options=options or None)


def sass_lines(cubin: bytes) -> list[tuple[str, str]]:
    """(label or '', instruction) in program order from nvdisasm."""
    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(nvdisasm), "-c", f.name], check=True, capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        m = re.match(r"^\s*(\.L_\w+):", line)
        if m:
            out.append((m.group(1), ""))
            continue
        m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?);", line)
        if m:
            ins = re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip())
            out.append(("", ins))
    return out


def amd_lines(asm: str) -> list[tuple[str, str]]:
    out = []
    for line in asm.splitlines():
        s = line.strip()
        m = re.match(r"^(\.LBB\w+):", s)
        if m:
            out.append((m.group(1), ""))
        elif s and not s.startswith((".", ";", "//")) and re.match(r"^[a-z_0-9]+", s) and not s.endswith(":"):
            out.append(("", s.split(";")[0].strip()))
    return out


def main_loop(lines, amd: bool) -> list[str]:
    """Instructions of the largest label..backward-branch range."""
    where = {lab: i for i, (lab, _) in enumerate(lines) if lab}
    best = []
    for i, (_, ins) in enumerate(lines):
        if not ins:
            continue
        m = re.search(r"(\.LBB\w+)\s*$", ins) if amd else re.search(r"BRA\s+.*?`?\(?(\.L_\w+)\)?", ins)
        if m and m.group(1) in where and where[m.group(1)] < i:
            body = [x for _, x in lines[where[m.group(1)]:i + 1] if x]
            if len(body) > len(best):
                best = body
    return best


def classify(body, amd: bool) -> dict:
    c = {"total": len(body), "alu": 0, "fma": 0, "mma": 0, "mem": 0, "other": 0}
    for ins in body:
        op = ins.split()[0]
        if amd:
            key = ("mma" if AMD_MMA.match(op) else "mem" if AMD_MEM.match(op) else
                   "other" if op.startswith("s_") else "fma" if AMD_FMA.match(op) else "alu")
        else:
            key = ("mma" if NV_MMA.match(op) else "mem" if NV_MEM.match(op) else "fma" if NV_FMA.match(op) else
                   "alu" if NV_ALU.match(op) else "other")
        c[key] += 1
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/kernels-loop-counts.json")
    ap.add_argument("--targets", default="cuda:90,cuda:86,hip:gfx1100")
    ap.add_argument("--merge-into", metavar="JSON", help="also store the rows as 'loop_counts' in this result file")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET")
    from triton.backends.compiler import GPUTarget

    from sglang_ext.kernels import targets as T

    rows = []
    variants = {label: (fn, spec, opts) for label, fn, spec, opts in T._variants()}
    for case in CASES:
        if case not in variants:
            continue
        fn, spec, opts = variants[case]
        tokens, warps = spec["BLOCK_N"].value, opts.get("num_warps") or 4
        for tname in args.targets.split(","):
            backend = T.TARGETS[tname][0]
            if backend not in opts.get(T.BACKENDS, (backend,)) or (case.endswith("launch") and tname != "cuda:90"):
                continue
            ck = compile_asm(fn, spec, GPUTarget(*T.TARGETS[tname]), opts, tname)
            amd = backend == "hip"
            lines = amd_lines(ck.asm["amdgcn"]) if amd else sass_lines(ck.asm["cubin"])
            body = main_loop(lines, amd)
            c = classify(body, amd)
            row = {"kernel": case, "target": tname, "tokens_per_iter": tokens, "warps": warps, "loop": c,
                   "warp_instr_per_token_head": c["total"] * warps / tokens,
                   "per_token_head": {k: v * warps / tokens for k, v in c.items()}}
            rows.append(row)
            print(f"{case:<52} {tname:<12} loop {c['total']:>5} ({c}) -> "
                  f"{row['warp_instr_per_token_head']:.1f} per token-head", flush=True)
            Path(args.out).write_text(json.dumps(rows, indent=1))
    if args.merge_into:
        res = json.loads(Path(args.merge_into).read_text())
        res["loop_counts"] = rows
        Path(args.merge_into).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
