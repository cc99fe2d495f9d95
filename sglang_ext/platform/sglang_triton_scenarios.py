"""The calls the portable_gpu platform's served paths make into SGLang's Triton launchers, one per served shape, on
CPU tensors: what platform/sglang_triton_targets.py records and builds ahead of time.

Served shapes: dense attention at head_dim 128 (32 q / 8 kv heads, and 8 / 8 for SGLang's MHA kernel) and 256
(16 q / 2 kv, Qwen3.5's full-attention layers), pages of 1 and 16 tokens, bf16; Qwen3-30B-A3B's fused MoE
(128 experts, top-8, 2048 -> 768) with SGLang's default configs for decode and prefill batches; Qwen3.5's Gated
DeltaNet layers (16 k / 32 v heads of 128, conv width 4), with the speculative target-verify variants (4 draft
tokens, chain and tree); paged experts over the same MoE with 64 of 128 experts resident.

A scenario runs only under sglang_triton_targets' recording (Triton's launches recorded, not run).
"""

from __future__ import annotations

import importlib

from sglang_ext import compat

BACKENDS = ("cuda", "hip")

# (q heads, kv heads, head_dim) of the attention scenarios; page sizes of the paged KV pool.
ATTENTION_SHAPES = ((32, 8, 128), (8, 8, 128), (16, 2, 256))
PAGE_SIZES = (1, 16)
# Qwen3-30B-A3B's experts (TP 1): experts, top-k, hidden, intermediate.
MOE_SHAPE = (128, 8, 2048, 768)
# Paged experts over those: K resident slots per layer (half of them).
PAGED_RESIDENT = 64
# Qwen3.5's Gated DeltaNet (TP 1): k heads, v heads, head dims, conv kernel width.
GDN_SHAPE = (16, 32, 128, 4)


def _launcher(name: str):
    module, _, attr = compat.SGLANG_TRITON_LAUNCHERS[name].rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _attention_scenarios():
    """SGLang's Triton attention backend: decode (stage 1 per head or per GQA group, stage 2; on ROCm also its Lean
    decode), extend (causal, and the speculative verify's custom mask), the per-batch split count and the KV index
    gather. SGLang's index dtypes:
    kv_indptr int32, kv_indices / qo_indptr / mask_indptr int64, custom_mask bool."""
    import torch

    bf16, f32, i32, i64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
    bs, slots, splits = 2, 64, 8
    out = {}
    for hq, hkv, d in ATTENTION_SHAPES:
        for page in PAGE_SIZES:
            tag = f"q{hq} kv{hkv} d{d} page{page}"

            def decode(hq=hq, hkv=hkv, d=d, page=page):
                kv = torch.empty(slots, hkv, d, dtype=bf16)
                _launcher("decode_attention_fwd")(
                    torch.empty(bs, hq, d, dtype=bf16), kv, kv.clone(), torch.empty(bs, hq, d, dtype=bf16),
                    torch.zeros(bs + 1, dtype=i32), torch.zeros(slots, dtype=i64),
                    torch.empty(bs, hq, splits, d, dtype=f32), torch.empty(bs, hq, splits, dtype=f32),
                    torch.full((bs,), 2, dtype=i32), splits, d ** -0.5, 1.0, 1.0, page_size=page)

            out[f"decode {tag}"] = decode
            if d <= 128:  # ROCm's Lean (work-stealing) decode for long contexts; its tiles fit head_dim <= 128
                def lean(hq=hq, hkv=hkv, d=d, page=page, programs=96):
                    kv = torch.empty(slots, hkv, d, dtype=bf16)
                    _launcher("decode_attention_fwd")(
                        torch.empty(bs, hq, d, dtype=bf16), kv, kv.clone(), torch.empty(bs, hq, d, dtype=bf16),
                        torch.zeros(bs + 1, dtype=i32), torch.zeros(slots, dtype=i64),
                        torch.empty(bs, hq, splits, d, dtype=f32), torch.empty(bs, hq, splits, dtype=f32),
                        torch.full((bs,), 2, dtype=i32), splits, d ** -0.5, 1.0, 1.0, page_size=page,
                        enable_lean=True, lean_Mp=torch.empty(programs, 16, dtype=f32),
                        lean_Lp=torch.empty(programs, 16, dtype=f32), lean_Op=torch.empty(programs, 16, d, dtype=f32),
                        lean_locks=torch.zeros(programs, dtype=i32))

                out[f"decode lean {tag}"] = (lean, ("hip",))
            for mask in (False, True) if page == 1 and d == 128 and hq != hkv else (False,):
                def extend(hq=hq, hkv=hkv, d=d, page=page, mask=mask):
                    kv, new = torch.empty(slots, hkv, d, dtype=bf16), torch.empty(16, hkv, d, dtype=bf16)
                    _launcher("extend_attention_fwd")(
                        torch.empty(16, hq, d, dtype=bf16), new, new.clone(), torch.empty(16, hq, d, dtype=bf16),
                        kv, kv.clone(), torch.tensor([0, 8, 16], dtype=i64), torch.zeros(bs + 1, dtype=i32),
                        torch.zeros(slots, dtype=i64), torch.ones(256, dtype=torch.bool) if mask else None,
                        not mask, torch.tensor([0, 64, 128], dtype=i64) if mask else None, 8, 1.0, 1.0,
                        sm_scale=d ** -0.5, page_size=page, extend_seq_lens_cpu=[8, 8])

                out[f"extend {tag}" + (" verify-mask" if mask else "")] = extend

    def metadata():
        hq, hkv, _ = ATTENTION_SHAPES[0]
        _launcher("get_num_kv_splits_triton")[(1,)](
            torch.empty(bs, dtype=i32), torch.ones(bs, dtype=i64), bs, 1, hq, hkv, splits, 132, MAX_NUM_SEQ=256,
            uneven_batch_ptr=None)
        req_to_token = torch.zeros(8, 4096, dtype=i32)
        _launcher("create_flashinfer_kv_indices_triton")[(bs, 1)](
            req_to_token, torch.zeros(bs, dtype=i64), torch.ones(bs, dtype=i64), torch.zeros(bs + 1, dtype=i32), None,
            torch.empty(slots, dtype=i64), req_to_token.stride(0), ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False,
            token_mapping=None)

    out["attention metadata"] = metadata
    return out


def _moe_scenarios():
    import torch
    import triton.language as tl

    experts, top_k, hidden, inter = MOE_SHAPE
    # SGLang's default configs (fused_moe_triton_config.get_default_config, bf16): M <= E, and M > E
    configs = {"decode": (4, {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}),
               "prefill": (512, {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8})}
    out = {}
    for phase, (m, config) in configs.items():
        # gate/up: [m, hidden] x [E, 2 * inter, hidden]; down: [m * top_k, inter] x [E, hidden, inter], router weights
        for gemm, (rows, n, k, routed, kernel_top_k) in {
                "up": (m, 2 * inter, hidden, False, top_k), "down": (m * top_k, hidden, inter, True, 1)}.items():
            def moe(m=m, config=config, rows=rows, n=n, k=k, routed=routed, kernel_top_k=kernel_top_k):
                blocks = (m * top_k + experts * config["BLOCK_SIZE_M"]) // config["BLOCK_SIZE_M"]
                _launcher("invoke_fused_moe_kernel")(
                    torch.empty(rows, k, dtype=torch.bfloat16), torch.empty(experts, n, k, dtype=torch.bfloat16),
                    None, torch.empty(m, top_k, n, dtype=torch.bfloat16), None, None, None, torch.empty(m, top_k),
                    torch.zeros(m, top_k, dtype=torch.int32),
                    torch.zeros(blocks * config["BLOCK_SIZE_M"], dtype=torch.int32),
                    torch.zeros(blocks, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), routed,
                    kernel_top_k, dict(config), compute_type=tl.bfloat16, use_fp8_w8a8=False, use_int8_w8a8=False,
                    use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False)

            out[f"fused_moe {gemm} {phase} E{experts} top{top_k} {hidden}x{inter}"] = moe

    def align(m=4, block=configs["decode"][1]["BLOCK_SIZE_M"]):
        # CUDA's routing alignment for at most 64 (token, expert) pairs with more than 63 experts: one Triton launch
        padded = m * top_k * block
        _launcher("moe_align_small_numel")(
            torch.zeros(m, top_k, dtype=torch.int32), experts + 1, block, torch.empty(padded, dtype=torch.int32),
            torch.empty(padded // block, dtype=torch.int32), torch.empty(1, dtype=torch.int32))

    out[f"fused_moe align decode E{experts} top{top_k}"] = (align, ("cuda",))
    return out


def _paged_moe_scenarios():
    """Paged experts (`--enable-paged-experts --paged-experts-num-resident K`) through SGLang's triton runner
    (paged_experts/runners.py TritonContract): the fused MoE GEMMs over the K-slot table, routed ids in slot space
    with the entries outside the wave at -1 (filtered), the down GEMM writing every routed entry times its router
    weight (no_combine, keep router weight); the alignment over K + 1 buckets (CUDA, one Triton launch from 64
    slots on); the contract's top-k sum (moe_combine_topk: SGLang's Triton reduce on ROCm above 32 tokens and on
    CUDA from sm_90 on up to 32 tokens)."""
    import torch
    import triton.language as tl

    experts, top_k, hidden, inter = MOE_SHAPE
    slots = PAGED_RESIDENT
    configs = {"decode": (4, {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}),
               "prefill": (512, {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8})}
    tag = f"K{slots} of E{experts} top{top_k}"

    def slot_ids(m):  # half the entries in the wave's slots, the rest outside it
        ids = torch.arange(m * top_k, dtype=torch.int32).remainder(slots).view(m, top_k)
        return ids.masked_fill(ids.remainder(2) == 1, -1)

    out = {}
    for phase, (m, config) in configs.items():
        for gemm, (rows, n, k, routed, kernel_top_k) in {
                "up": (m, 2 * inter, hidden, False, top_k), "down": (m * top_k, hidden, inter, True, 1)}.items():
            def moe(m=m, config=config, rows=rows, n=n, k=k, routed=routed, kernel_top_k=kernel_top_k):
                blocks = (m * top_k + (slots + 1) * config["BLOCK_SIZE_M"]) // config["BLOCK_SIZE_M"]
                _launcher("invoke_fused_moe_kernel")(
                    torch.empty(rows, k, dtype=torch.bfloat16), torch.empty(slots, n, k, dtype=torch.bfloat16),
                    None, torch.empty(m, top_k, n, dtype=torch.bfloat16), None, None, None, torch.empty(m, top_k),
                    slot_ids(m), torch.zeros(blocks * config["BLOCK_SIZE_M"], dtype=torch.int32),
                    torch.zeros(blocks, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), routed,
                    kernel_top_k, dict(config), compute_type=tl.bfloat16, use_fp8_w8a8=False, use_int8_w8a8=False,
                    use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False, filter_expert=True)

            out[f"paged_experts {gemm} {phase} {tag} {hidden}x{inter}"] = moe

    def align(m=4, block=configs["decode"][1]["BLOCK_SIZE_M"]):
        padded = m * top_k * block
        _launcher("moe_align_small_numel")(
            slot_ids(m), slots + 1, block, torch.empty(padded, dtype=torch.int32),
            torch.empty(padded // block, dtype=torch.int32), torch.empty(1, dtype=torch.int32))

    out[f"paged_experts align decode {tag}"] = (align, ("cuda",))
    for phase, m, backends in (("decode", 4, ("cuda",)), ("prefill", 512, ("hip",))):
        def top_k_sum(m=m):
            _launcher("moe_sum_reduce_triton")(torch.empty(m, top_k, hidden, dtype=torch.bfloat16),
                                               torch.empty(m, hidden, dtype=torch.bfloat16), 1.0)

        out[f"paged_experts top-k sum {phase} top{top_k} h{hidden}"] = (top_k_sum, backends)
    return out


def _gdn_scenarios():
    import torch

    hk, hv, d, width = GDN_SHAPE
    bf16, f32, i32 = torch.bfloat16, torch.float32, torch.int32
    conv_dim, slots = 2 * hk * d + hv * d, 4

    def conv_prefill():
        _launcher("causal_conv1d_fn")(
            torch.empty(conv_dim, 24, dtype=bf16), torch.empty(conv_dim, width, dtype=bf16), None,
            conv_states=torch.zeros(slots, conv_dim, width - 1, dtype=bf16), query_start_loc=torch.tensor(
                [0, 8, 24], dtype=i32), seq_lens_cpu=[8, 16], cache_indices=torch.tensor([0, 1], dtype=i32),
            has_initial_state=torch.tensor([False, True]), activation="silu")

    def conv_decode():
        _launcher("causal_conv1d_update")(
            torch.empty(2, conv_dim, dtype=bf16), torch.zeros(slots, conv_dim, width - 1, dtype=bf16),
            torch.empty(conv_dim, width, dtype=bf16), None, "silu",
            conv_state_indices=torch.tensor([0, 1], dtype=i32))

    def gating():
        _launcher("fused_gdn_gating")(torch.empty(hv, dtype=f32), torch.empty(24, hv, dtype=bf16),
                                      torch.empty(24, hv, dtype=bf16), torch.empty(hv, dtype=f32))

    def chunk():
        t = 24
        _launcher("chunk_gated_delta_rule")(
            q=torch.empty(1, t, hk, d, dtype=bf16), k=torch.empty(1, t, hk, d, dtype=bf16),
            v=torch.empty(1, t, hv, d, dtype=bf16), g=torch.zeros(1, t, hv, dtype=f32),
            beta=torch.empty(1, t, hv, dtype=bf16), initial_state=torch.zeros(slots, hv, d, d, dtype=f32),
            initial_state_indices=torch.tensor([0, 1], dtype=i32), cu_seqlens=torch.tensor([0, 8, t], dtype=torch.long),
            head_first=False, use_qk_l2norm_in_kernel=True)

    def packed_decode():
        b = 2
        _launcher("fused_recurrent_gated_delta_rule_packed_decode")(
            mixed_qkv=torch.empty(b, conv_dim, dtype=bf16), a=torch.empty(b, hv, dtype=bf16),
            b=torch.empty(b, hv, dtype=bf16), A_log=torch.empty(hv, dtype=f32), dt_bias=torch.empty(hv, dtype=f32),
            scale=d ** -0.5, initial_state=torch.zeros(slots, hv, d, d, dtype=f32),
            out=torch.empty(b, 1, hv, d, dtype=bf16), ssm_state_indices=torch.tensor([0, 1], dtype=i32),
            use_qk_l2norm_in_kernel=True)

    def sigmoid_gating(tokens=2):
        _launcher("fused_sigmoid_gating_delta_rule_update")(
            A_log=torch.empty(hv, dtype=f32), a=torch.empty(tokens, hv, dtype=bf16),
            dt_bias=torch.empty(hv, dtype=f32), softplus_beta=1.0, softplus_threshold=20.0,
            q=torch.empty(1, tokens, hk, d, dtype=bf16), k=torch.empty(1, tokens, hk, d, dtype=bf16),
            v=torch.empty(1, tokens, hv, d, dtype=bf16), b=torch.empty(tokens, hv, dtype=bf16),
            initial_state_source=torch.zeros(slots, hv, d, d, dtype=f32),
            initial_state_indices=torch.tensor([0, 1], dtype=i32),
            cu_seqlens=torch.arange(0, tokens + 1, tokens // 2, dtype=i32), use_qk_l2norm_in_kernel=True)

    def conv_verify(tree, bs=2, draft=4):
        # speculative target verify (NEXTN / MTP): each draft token's conv window saved; a tree walks retrieve_*
        links = {name: torch.zeros(bs, draft, dtype=torch.int64) if tree else None
                 for name in ("retrieve_next_token", "retrieve_next_sibling", "retrieve_parent_token")}
        _launcher("causal_conv1d_update")(
            torch.empty(bs, conv_dim, draft, dtype=bf16), torch.zeros(slots, conv_dim, width - 1, dtype=bf16),
            torch.empty(conv_dim, width, dtype=bf16), None, "silu", conv_state_indices=torch.tensor([0, 1], dtype=i32),
            intermediate_conv_window=torch.zeros(slots + 1, draft, conv_dim, width - 1, dtype=bf16),
            intermediate_state_indices=torch.tensor([0, 1], dtype=i32), **links)

    def gating_verify(tree, bs=2, draft=4):
        tokens = bs * draft
        _launcher("fused_sigmoid_gating_delta_rule_update")(
            A_log=torch.empty(hv, dtype=f32), a=torch.empty(tokens, hv, dtype=bf16),
            dt_bias=torch.empty(hv, dtype=f32), softplus_beta=1.0, softplus_threshold=20.0,
            q=torch.empty(1, tokens, hk, d, dtype=bf16), k=torch.empty(1, tokens, hk, d, dtype=bf16),
            v=torch.empty(1, tokens, hv, d, dtype=bf16), b=torch.empty(tokens, hv, dtype=bf16),
            initial_state_source=torch.zeros(slots, hv, d, d, dtype=f32),
            initial_state_indices=torch.tensor([0, 1], dtype=i32),
            cu_seqlens=torch.arange(0, tokens + 1, draft, dtype=i32), use_qk_l2norm_in_kernel=True,
            disable_state_update=True, intermediate_states_buffer=torch.zeros(slots + 1, draft, hv, d, d, dtype=f32),
            intermediate_state_indices=torch.tensor([0, 1], dtype=i32), cache_steps=draft,
            retrieve_parent_token=torch.zeros(bs, draft, dtype=torch.int64) if tree else None)

    # After the verify the accepted step's states go into the pool (one layer here). The launchers refuse non-GPU
    # tensors, so their kernels are launched here as the launchers launch them (mamba_state_scatter_triton.py).
    def commit_ssm(draft=4):
        src, dst = torch.zeros(1, slots + 1, draft, hv, d, d, dtype=f32), torch.zeros(1, slots, hv, d, d, dtype=f32)
        rows = torch.tensor([0, 1], dtype=i32)
        _launcher("_fused_mamba_state_scatter_with_mask_kernel")[(2, 1, d * d * hv // 1024)](
            src, dst, rows, torch.tensor([1, 3], dtype=i32), rows, hv * d * d, src.stride(0), src.stride(1),
            src.stride(2), dst.stride(0), dst.stride(1), slots + 1, draft, slots, BLOCK_SIZE=1024)

    def commit_conv(draft=4):
        # the deduplicated window cache: step t's window is shared[..., t:t + width - 1]
        shared = torch.zeros(1, slots + 1, conv_dim, draft + width - 2, dtype=bf16)
        src = shared.as_strided((1, slots + 1, draft, conv_dim, width - 1),
                                (shared.stride(0), shared.stride(1), 1, shared.stride(2), 1))
        dst, rows = torch.zeros(1, slots, conv_dim, width - 1, dtype=bf16), torch.tensor([0, 1], dtype=i32)
        _launcher("_fused_conv_window_scatter_with_mask_kernel")[(2, 1, 1)](
            src, dst, rows, torch.tensor([1, 3], dtype=i32), rows, conv_dim * (width - 1), width - 1,
            *src.stride(), dst.stride(0), dst.stride(1), slots + 1, draft, slots, BLOCK_SIZE=1024)

    tag = f"hk{hk} hv{hv} d{d}"
    verify = {f"gdn {name} verify {shape} {tag}": (lambda call=call, tree=tree: call(tree))
              for name, call in (("conv1d", conv_verify), ("sigmoid-gating", gating_verify))
              for shape, tree in (("chain", False), ("tree", True))}
    verify[f"gdn verify commit ssm-state {tag}"] = commit_ssm
    verify[f"gdn verify commit conv-window {tag}"] = commit_conv
    return {f"gdn conv1d prefill {tag}": conv_prefill, f"gdn conv1d decode {tag}": conv_decode,
            f"gdn gating {tag}": gating, f"gdn chunk prefill {tag}": chunk,
            f"gdn packed decode {tag}": packed_decode, f"gdn sigmoid-gating decode {tag}": sigmoid_gating, **verify}


def _qwen3_5_layer_scenarios():
    """Triton ops of a Qwen3.5 layer around attention: the gated full-attention layer's q/k norm (with partial RoPE,
    rotary 64 of 256, on CUDA; without it on ROCm, where RoPE is torch), its output gate, the GDN projection split
    (decode) and the GDN output's gated RMSNorm."""
    import torch

    hq, hkv, d = ATTENTION_SHAPES[-1]
    hk, hv, dk, _ = GDN_SHAPE
    bf16, tokens = torch.bfloat16, 8

    def norm_rope_gate():
        _launcher("fused_qk_gemma_rmsnorm_rope_gate")(
            torch.empty(tokens, hq * 2 * d, dtype=bf16), torch.empty(tokens, hkv * d, dtype=bf16),
            torch.empty(d, dtype=bf16), torch.empty(d, dtype=bf16), torch.empty(4096, 64, dtype=torch.float32),
            torch.zeros(tokens, dtype=torch.int64), 1e-6, hq, hkv, d, 64)

    def norm_gate():
        _launcher("fused_qk_gemma_rmsnorm_with_gate")(
            torch.empty(tokens, hq * 2 * d, dtype=bf16), torch.empty(tokens, hkv * d, dtype=bf16),
            torch.empty(d, dtype=bf16), torch.empty(d, dtype=bf16), 1e-6, d, hq)

    def output_gate():
        _launcher("fused_sigmoid_mul")(torch.empty(tokens, hq * d, dtype=bf16),
                                       torch.empty(tokens, hq * d, dtype=bf16), inplace=True)

    def gdn_split():
        _launcher("fused_qkvzba_split_reshape_cat_contiguous")(
            torch.empty(tokens, 2 * hk * dk + 2 * hv * dk, dtype=bf16), torch.empty(tokens, 2 * hv, dtype=bf16),
            hk, hv, dk, dk)

    def gated_rmsnorm():
        _launcher("layernorm_fn")(torch.empty(tokens * hv, dk, dtype=bf16), torch.empty(dk, dtype=bf16), None,
                                  z=torch.empty(tokens * hv, dk, dtype=bf16), eps=1e-6, group_size=None,
                                  norm_before_gate=True, is_rms_norm=True, activation="swish")

    return {f"qwen3_5 qk-norm-rope-gate q{hq} kv{hkv} d{d} rotary64": (norm_rope_gate, ("cuda",)),
            f"qwen3_5 qk-norm-gate q{hq} kv{hkv} d{d}": (norm_gate, ("hip",)),
            f"qwen3_5 output-gate q{hq} d{d}": output_gate,
            f"qwen3_5 gdn split hk{hk} hv{hv} d{dk}": gdn_split,
            f"qwen3_5 gdn gated-rmsnorm d{dk}": gated_rmsnorm}


def scenarios() -> dict:
    """{scenario label: (a call of SGLang's launcher on CPU tensors of a served shape, the backends whose served
    path makes that call)}."""
    found = {**_attention_scenarios(), **_moe_scenarios(), **_paged_moe_scenarios(), **_gdn_scenarios(),
             **_qwen3_5_layer_scenarios()}
    return {label: entry if isinstance(entry, tuple) else (entry, BACKENDS) for label, entry in found.items()}
