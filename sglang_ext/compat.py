"""Every SGLang 0.5.23 name sglang-ext depends on, in one place.

Public extension points (plugin loader, platform base classes) and private internals (hook targets, pool
classes) are all reached through this module, so a SGLang version bump is one file to read. Names are
resolved lazily (PEP 562): importing SGLang's memory-pool modules while SGLang is still choosing its
platform would re-enter platform discovery.
"""

import importlib

SGLANG_VERSION = "0.5.23"

# name -> "module:attribute", resolved on first access.
_LAZY = {
    # Plugin machinery (public).
    "HookRegistry": "sglang.srt.plugins.hook_registry:HookRegistry",
    "HookType": "sglang.srt.plugins.hook_registry:HookType",
    # Platform base classes (public extension point for out-of-tree platforms).
    "SRTPlatform": "sglang.srt.platforms.interface:SRTPlatform",
    "PlatformCapabilities": "sglang.srt.platforms.interface:PlatformCapabilities",
    "PlatformEnum": "sglang.srt.platforms.device_mixin:PlatformEnum",
    "CpuDeviceMixin": "sglang.srt.platforms.cpu:CpuDeviceMixin",  # CPU device ops: psutil memory, gloo
    "CudaDeviceMixin": "sglang.srt.platforms.cuda:CudaDeviceMixin",  # CUDA/ROCm device ops: torch.cuda, NCCL
    # Graph runners an out-of-tree platform must name (SGLang refuses to fall back to its CUDA ones for it): the
    # decode / verify runner and the EAGLE draft decode / draft extend runners, what SGLang itself uses on CUDA.
    "DecodeCudaGraphRunner": "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner",
    "EAGLEDraftCudaGraphRunner": "sglang.srt.speculative.eagle_draft_cuda_graph_runner:EAGLEDraftCudaGraphRunner",
    "EAGLEDraftExtendCudaGraphRunner":
        "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner:EAGLEDraftExtendCudaGraphRunner",
    # Internal: SGLang's HiCache page-hash extension (C++, built by torch on first use; hicache/hooks.py loads it
    # while the storage backend is created, not in the prefetch thread).
    "load_hicache_native_hash": "sglang.srt.mem_cache.cpp_utils.native_hash:_load_native_hash_module",
    # Internal: base class of the CPU HiCache host pool.
    "MHATokenToKVPoolHost": "sglang.srt.mem_cache.pool_host.mha:MHATokenToKVPoolHost",
    # Runtime context accessors (kvcache/ reads the parallel layout, features, speculative config, backends).
    "get_parallel": "sglang.srt.runtime_context:get_parallel",
    "get_exec": "sglang.srt.runtime_context:get_exec",
    "get_spec": "sglang.srt.runtime_context:get_spec",
    "attention_backends": "sglang.srt.runtime_context:attention_backends",
    # Internal: the compressed KV pool (kvcache/pool.py) subclasses the MHA device pool and overrides or reads
    # its _create_buffers, _build_kv_buffer_descs, _init_data_ptrs_and_strides, _init_kv_copy_and_warmup,
    # _clear_buffers, _pd_registerable_tensors, _get_key_buffer, _get_value_buffer, _move_kv_cache_impl,
    # _check_physical_write_loc, _kv_buffer_descs, _kv_copy_config, memory_saver_adapter,
    # layer_transfer_counter, kv_cache_layout, post_capture_active, _mha_buffer_info (HiCache host-pool input).
    "MHATokenToKVPool": "sglang.srt.mem_cache.memory_pool:MHATokenToKVPool",
    "KvBufferDesc": "sglang.srt.mem_cache.memory_pool:KvBufferDesc",
    "KVWriteLoc": "sglang.srt.mem_cache.memory_pool:KVWriteLoc",
    "unwrap_write_loc": "sglang.srt.mem_cache.memory_pool:unwrap_write_loc",
    "GPU_MEMORY_TYPE_KV_CACHE": "sglang.srt.constants:GPU_MEMORY_TYPE_KV_CACHE",
    # Internal: SGLang's hybrid (linear-attention + full-attention) KV pool; kvcache/hybrid_pool.py reads its
    # full_kv_pool, full_attention_layer_id_mapping, layer_transfer_counter and start_layer.
    "HybridLinearKVPool": "sglang.srt.mem_cache.memory_pool:HybridLinearKVPool",
    # Internal: attention backends the compressed-KV backends subclass (kvcache/torch_backend.py reads
    # token_to_kv_pool, req_to_token_pool; kvcache/triton_backend.py reads forward_metadata (qo_indptr,
    # kv_indptr, kv_indices, custom_mask, mask_indptr, max_extend_len, num_kv_splits), max_kv_splits,
    # page_size, dcp_size, use_mla, enable_deterministic) and the layer/batch enums they test.
    "TorchNativeAttnBackend": "sglang.srt.layers.attention.torch_native_backend:TorchNativeAttnBackend",
    "TritonAttnBackend": "sglang.srt.layers.attention.triton_backend:TritonAttnBackend",
    "AttentionType": "sglang.srt.layers.radix_attention:AttentionType",
    "ForwardMode": "sglang.srt.model_executor.forward_batch_info:ForwardMode",
    # --- compressed HiCache host tier and storage tier (sglang_ext/hicache) ---
    # Host pool base class and the device-pool description the host pool is built from.
    "HostKVCache": "sglang.srt.mem_cache.pool_host.base:HostKVCache",
    "MHABufferInfo": "sglang.srt.mem_cache.device_pool_info:MHABufferInfo",
    "KVBuffers": "sglang.srt.mem_cache.device_pool_info:KVBuffers",
    "KVBufferLayout": "sglang.srt.mem_cache.device_pool_info:KVBufferLayout",
    # Storage interface (public to storage backends) and the file backend we subclass.
    "HiCacheStorage": "sglang.srt.mem_cache.hicache_storage:HiCacheStorage",
    "HiCacheStorageExtraInfo": "sglang.srt.mem_cache.hicache_storage:HiCacheStorageExtraInfo",
    "HiCacheFile": "sglang.srt.mem_cache.hicache_storage:HiCacheFile",
    "maybe_wrap_storage_failure_injector": (
        "sglang.srt.mem_cache.hicache_storage:_maybe_wrap_hicache_storage_failure_injector"
    ),
}

# Hook targets (dotted paths into SGLang internals).
# Picks the HiCache host pool class for an MHA device pool; the CPU platform answers with its own pool.
HOOK_GET_MHA_HOST_POOL_CLS = "sglang.srt.mem_cache.pool_host.mha.get_mha_host_pool_cls"
# Argument parser construction and parsing (pp/server_args.py adds --pp-layer-partition; kvcache/ extends
# --kv-cache-dtype).
HOOK_SERVER_ARGS_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"  # staticmethod (parser)
HOOK_SERVER_ARGS_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"  # classmethod (cls, namespace)
# Read by sglang.srt.distributed.utils.get_pp_indices in every PP rank.
ENV_PP_LAYER_PARTITION = "SGLANG_PP_LAYER_PARTITION"
# Llama-family model (tied embeddings under PP): module with ParallelLMHead, add_prefix, get_parallel,
# default_weight_loader; its __init__ and load_weights; the checkpoint name of the tied matrix.
LLAMA_MODULE = "sglang.srt.models.llama"
HOOK_LLAMA_INIT = "sglang.srt.models.llama.LlamaForCausalLM.__init__"
HOOK_LLAMA_LOAD_WEIGHTS = "sglang.srt.models.llama.LlamaForCausalLM.load_weights"
LLAMA_EMBED_WEIGHT_NAME = "model.embed_tokens.weight"
# KV cache decisions (kvcache/hooks.py): the --kv-cache-dtype string -> (name, dtype); pool configuration (start-up
# checks run before it); bytes per token for memory sizing; the MHA device pool; the full-attention backend.
HOOK_CONFIGURE_KV_CACHE_DTYPE = "sglang.srt.mem_cache.kv_cache_dtype.configure_kv_cache_dtype"
HOOK_KV_CACHE_CONFIGURE = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure"
HOOK_POOL_CELL_SIZE = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size"
HOOK_BUILD_MHA_KV_POOL = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._build_mha_kv_pool"
# The class of the full-attention sub-pool inside SGLang's hybrid linear-attention pool (HybridLinearKVPool).
HOOK_HYBRID_FULL_ATTENTION_POOL_CLASS = (
    "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._hybrid_full_attention_pool_class"
)
HOOK_BUILD_FULL_ATTENTION_BACKEND = (
    "sglang.srt.model_executor.model_runner_components.attention_backend_setup._build_full_attention_backend_from_str"
)
# --- compressed HiCache (sglang_ext/hicache) ---
# Builds every HiCache storage backend (classmethod: cls, backend_name, storage_config, mem_pool_host).
HOOK_CREATE_STORAGE_BACKEND = "sglang.srt.mem_cache.storage.backend_factory.StorageBackendFactory.create_backend"
# Backends the cache controller drives through zero-copy batch_get_v1/batch_set_v1 (host memory addressed by
# pointers, `cache_controller.py` attach_storage_backend), plus "dynamic" with extra_config interface_v1.
ZERO_COPY_STORAGE_BACKENDS = ("hf3fs", "mooncake", "npu_memcache", "eic", "nixl", "simm", "mori", "tensorcast", "seaweedfs")
# Resolves the parsed server arguments once, in the launcher, before anything is loaded: start-up checks run here.
HOOK_SERVER_ARGS_RESOLVE = "sglang.srt.server_args.ServerArgs.resolve_once"


# SSD-resident PLE tables (ple/sglang_glue.py) ------------------------------------------------------------------
# The flag: `ple_offload_backend` is `Annotated[str, Arg(choices=["pinned", "file"])]` on the namespace class
# ExecOffload and, as a separate copy of the Arg, on ServerArgs; the CLI parser reads ServerArgs' `Arg.choices`
# when it is built, which is after plugins load. (module, class) pairs:
PLE_FLAG_RECORDS = (("sglang.srt.arg_groups.fields.exec_", "ExecOffload"), ("sglang.srt.server_args", "ServerArgs"))
PLE_BACKEND_FIELD = "ple_offload_backend"
# Resolved server settings inside the scheduler: get_exec().offload.ple_offload_backend, get_model().model_path.
RUNTIME_CONTEXT_MODULE = "sglang.srt.runtime_context"
# qwen4_exp: Qwen4ExpNGramEmbedding.__init__ builds `Qwen4ExpPinnedHostEmbedding(embedding, backend=, table_dir=)`
# (module-global lookup) and load_weights checks `isinstance(emb, Qwen4ExpPinnedHostEmbedding)`; the class copies
# the attributes named in its `_COPIED_ATTRIBUTES` from the source embedding.
QWEN4_MODULE = "sglang.srt.models.qwen4_exp"
QWEN4_HOST_EMBEDDING = "Qwen4ExpPinnedHostEmbedding"
QWEN4_TOP_MODEL = "Qwen4ExpForConditionalGeneration"
QWEN4_COPIED_ATTRS = "_COPIED_ATTRIBUTES"
QWEN4_SHARD_MARK = ".ngram_embedding.shard_"  # checkpoint tensors `<prefix>.ngram_embedding.shard_<i>.weight`
QWEN4_DEFAULT_SPLIT_PARTS = 512  # load_weights: getattr(text_config, "split_ngram_parts", 512)
# Qwen4ExpNGramEmbedding.__init__ reads config.ple_offload_embedding (meta table + the offloaded class) and builds
# its table in bf16/fp8; its forward and Qwen4ExpPLELayer._consume_prefetched_embeddings return bf16 rows.
QWEN4_NGRAM_EMBEDDING = "Qwen4ExpNGramEmbedding"
QWEN4_PLE_LAYER = "Qwen4ExpPLELayer"
QWEN4_CONSUME_PREFETCHED = "_consume_prefetched_embeddings"
# qwen4_exp builds its hyper-connections from `HyperConnectionConfig(..., params_dtype=torch.bfloat16)` (module
# global, imported from sglang.srt.layers.hyperconnection; keyword arguments only).
QWEN4_HC_CONFIG = "HyperConnectionConfig"
# Gemma 3n: Gemma3nTextModel.embed_tokens_per_layer (nn.Embedding subclass with .embed_scale), loaded by name.
GEMMA3N_MODULE = "sglang.srt.models.gemma3n_causal"
GEMMA3N_TEXT_MODEL = "Gemma3nTextModel"
GEMMA3N_PLE_ATTR = "embed_tokens_per_layer"
# On device "cpu", ModelRunner pads `intermediate_size` with `attr % padding`; Gemma 3n's is a per-layer list,
# which raises TypeError. Hooked (AROUND) so list values are padded element-wise.
HOOK_UPDATE_INTERMEDIATE_SIZE = "sglang.srt.configs.update_config.update_intermediate_size"
# On device "cpu", ModelRunner also records original_num_attention_heads on every config; Qwen2DecoderLayer then
# takes head_dim = hidden_size // that, ignoring the config's head_dim. Hooked (AROUND) so an explicit head_dim
# holds (platform/explicit_head_dim.py).
HOOK_QWEN2_DECODER_LAYER_INIT = "sglang.srt.models.qwen2.Qwen2DecoderLayer.__init__"
# On a CUDA device SGLang's DualGemm (Qwen2 MLPs) picks its CuTe DSL kernel, which imports nvidia-cutlass-dsl; the
# portable GPU platform replaces the choice with None (the unfused path, platform/hooks.py).
HOOK_DUAL_GEMM_SELECT_MODE = "sglang.srt.layers.dual_gemm.DualGemm._select_mode"
# SGLang's EAGLE worker imports its FlashMLA backend module (to list the backends whose draft extend it can capture)
# on every CUDA device, and that module imports the `flash_mla` package (sgl-flash-mla, a CUDA-only wheel the portable
# GPU platform does not need). Where that package is absent the platform puts a module in its place whose
# FlashMLABackend refuses in one line (platform/hooks.py); nothing can be an instance of it.
FLASHMLA_BACKEND_MODULE = "sglang.srt.layers.attention.flashmla_backend"
FLASHMLA_BACKEND_CLASS = "FlashMLABackend"
# torch_native attention (what SGLang picks on device "cpu") allocates its output with `empty_like(q)`; Gemma 3n
# passes q as [tokens, heads, head_dim], so the output comes back 3-D and o_proj fails. Its forward_extend and
# forward_decode are hooked (AROUND) to flatten q to 2-D first (the backend views it as [-1, heads, head_dim]).
TORCH_NATIVE_ATTN_BACKEND = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
# Its extend attends all prefix + new rows of a request (the prefix rows' queries uninitialised) and keeps the new
# ones; the CPU platform hooks (AROUND) this method to attend only the new rows (platform/prefix_attention.py).
HOOK_TORCH_NATIVE_SDPA_EXTEND = f"{TORCH_NATIVE_ATTN_BACKEND}._run_sdpa_forward_extend"
# Seeded sampling (`sampling_seed`) hashes (seed, position, token) with this; on a CPU device it needs sgl_kernel's
# CPU build. The portable CPU platform replaces it with sglang_ext.platform.seeded_sampling.murmur_hash32.
HOOK_MURMUR_HASH32 = "sglang.kernels.ops.sampling.murmur_hash.murmur_hash32"
# A decode step's batch preparation (self); with the Mamba radix cache's extra_buffer strategy it pins the track mask
# unconditionally (pin_memory() needs a CUDA driver). The CPU platform hooks it (AROUND, platform/mamba_snapshots.py).
HOOK_SCHEDULE_BATCH_PREPARE_FOR_DECODE = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"
# --- batch-invariant mode on the portable CPU platform (platform/batch_invariant.py) ---------------------------
# --enable-deterministic-inference: SGLang validates the attention backend against a list it lets platforms extend
# (`add_deterministic_attention_backend_choices`, list.extend); ModelRunner then calls
# maybe_enable_batch_invariant_mode (self), which registers Triton GEMMs for a CUDA/XPU/NPU dispatch key.
_LAZY["add_deterministic_attention_backend_choices"] = (
    "sglang.srt.arg_groups.choices:add_deterministic_attention_backend_choices")
HOOK_ENABLE_BATCH_INVARIANT_MODE = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode"
# One forward step (self, forward_batch, ...): the mode reads forward_batch.forward_mode.
HOOK_MODEL_RUNNER_FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
# Every unquantized linear layer's matmul (self, layer, x, bias=None); on this platform it ends in F.linear.
HOOK_UNQUANTIZED_LINEAR_APPLY = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
# The logits matmul (self, hidden_states, lm_head, embedding_bias=None, *, out=None).
HOOK_LOGITS_COMPUTE_LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"
# Checkpoint name prefixes SGLang's loaders rewrite before matching parameters: (old, new).
CKPT_NAME_RENAMES = (("model.language_model.", "model."),)

# --- Agent sessions: session retention (sglang_ext/sessions/) -----------------------------------------------
# Public registry of radix-cache factories (`--radix-cache-backend <name>`), and the builder of SGLang's default
# UnifiedRadixCache that our factory calls with its own cache class.
_LAZY.update({
    "register_radix_cache_backend": "sglang.srt.mem_cache.registry:register_radix_cache_backend",
    "registered_radix_cache_backends": "sglang.srt.mem_cache.registry:registered_radix_cache_backends",
    "create_unified_radix_cache": "sglang.srt.mem_cache.registry:create_unified_radix_cache",
    "UnifiedRadixCache": "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache",
    # SGLang's node access counter (stored as `last_access_time` on every radix node).
    "get_and_increase_time_counter": "sglang.srt.mem_cache.unified_cache.components.base:get_and_increase_time_counter",
})
# The pure-Python TreeCore: its eviction walks read `tree_core.eviction_strategy.get_priority(node)` for device
# leaves and host leaves (`unified_cache/components/full.py`); the Rust TreeCore orders eviction natively.
TREE_CORE_BACKEND_PYTHON = "python"
# UnifiedRadixCache internals the retention cache overrides: the eviction walk behind `evict` and
# `evict_for_alloc`, and the step that evicts one device leaf (demote if backed up, else drop).
URC_EVICT_WALK = "_evict"  # (self, params, available_size_targets=None, *, allocation_reclaim_satisfied=None)
URC_EVICT_DEVICE_LEAF = "_evict_device_leaf"  # (self, node_id, tracker) -> Optional[BackupKV]
# Hybrid (Mamba / GDN) trees: the retention cache reorders the per-component LRU lists of the MAMBA component
# (`tree_core.lru_lists[ct]` / `host_lru_lists[ct]`: UnifiedLRUList; we read `cache` {node id: node} and call
# `reset_node_mru(node)`) before each eviction walk, whose Mamba step walks that list from its LRU end.
URC_EVICT_HOST = "evict_host"  # (self, num_tokens, component_type=ComponentType.FULL) -> int
_LAZY["ComponentType"] = "sglang.srt.mem_cache.unified_cache.component_type:ComponentType"
# HiCache for hybrids on the portable CPU platform (hicache/mamba_host_pool.py): SGLang's Mamba host pool, the
# builder the hybrid host-pool assembly calls for it (REPLACE: ours builds the CPU subclass with the same
# arguments), and what that builder reads.
_LAZY["MambaPoolHost"] = "sglang.srt.mem_cache.pool_host.mamba:MambaPoolHost"
_LAZY["get_memory"] = "sglang.srt.runtime_context:get_memory"
_LAZY["get_host_allocator_type"] = "sglang.srt.mem_cache.pool_host.common:get_allocator_type"
HOOK_BUILD_MAMBA_HOST_POOL = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_mamba_host_pool"
# --- hybrid GDN models on the portable CPU platform (sglang_ext/hybrid/) -----------------------------------
# The Triton kernels SGLang's Gated DeltaNet path (Qwen3.5 / Qwen3-Next / qwen4_exp) calls off CUDA without
# SGLANG_USE_CPU_ENGINE, replaced (REPLACE) by the torch ops of sglang_ext.hybrid.ops of the same name; the
# gated RMSNorm's `layernorm_fn` by an adapter. Their importers bind them with `from X import Y`.
GDN_KERNEL_TARGETS = {
    "chunk_gated_delta_rule": "sglang.kernels.ops.attention.fla.chunk.chunk_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update":
        "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent.fused_sigmoid_gating_delta_rule_update",
    "fused_recurrent_gated_delta_rule_packed_decode":
        "sglang.kernels.ops.attention.fla.fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode",
    "causal_conv1d_fn": "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_fn",
    "causal_conv1d_update": "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update",
    "fused_gdn_gating": "sglang.kernels.ops.attention.linear.fused_gdn_gating.fused_gdn_gating",
    "fused_qkvzba_split_reshape_cat": "sglang.kernels.ops.attention.triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat",
    "fused_qkvzba_split_reshape_cat_contiguous":
        "sglang.kernels.ops.attention.triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat_contiguous",
    "fused_sigmoid_mul": "sglang.kernels.ops.elementwise.elementwise.fused_sigmoid_mul",
    "layernorm_fn": "sglang.kernels.ops.attention.fla.layernorm_gated.layernorm_fn",
    "fused_gate_sigmoid_mul": "sglang.kernels.ops.elementwise.elementwise.fused_gate_sigmoid_mul",
    "fused_gate_sigmoid_mul_add": "sglang.kernels.ops.elementwise.elementwise.fused_gate_sigmoid_mul_add",
    # The commit of the accepted draft step's states after a speculative verify (NEXTN / MTP on hybrids).
    "fused_mamba_state_scatter_with_mask":
        "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_mamba_state_scatter_with_mask",
    "fused_conv_window_scatter_with_mask":
        "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_with_mask",
    "fused_conv_window_scatter_multi":
        "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_multi",
    # The decode-time state checkpoint of --mamba-radix-cache-strategy extra_buffer (working slot -> track slot).
    "track_mamba_states_if_needed": "sglang.kernels.ops.mamba.mamba_state_scatter_triton.track_mamba_states_if_needed",
    "track_mamba_states_all_layers":
        "sglang.kernels.ops.mamba.mamba_state_scatter_triton.track_mamba_states_all_layers",
}
# qwen4_exp's QSA indexer (a fused op) defines forward_cuda / forward_xpu only; on an out-of-tree platform the
# fused-op dispatch calls forward_native, which raises NotImplementedError. Both of its forwards are
# `_forward_impl`, SGLang's portable orchestration (torch fallbacks for non-CUDA tensors). hybrid/qsa.py.
# forward_native is inherited (MultiPlatformOp), so it is not in the class body test_compat reads for HOOK_ names;
# its signature (HOOKED_SIGNATURES) is read from the imported class.
QSA_INDEXER_FORWARD_NATIVE = "sglang.srt.layers.attention.qsa.qsa_indexer.QSAIndexer.forward_native"
QSA_INDEXER_FORWARD_IMPL = "_forward_impl"
# Steps of that path replaced by the torch ops of sglang_ext/hybrid/ops/qsa_sparse.py on the CPU platform: the
# prefill's compressed-key gather (a Triton kernel on every device) and the two non-CUDA steps that loop over
# query rows in Python (block top-k, sparse attention).
QSA_KERNEL_TARGETS = {
    "gather_qsa_compressed_keys": "sglang.srt.layers.attention.qsa.kernel.gather_qsa_compressed_keys",
    "qsa_fast_topk": "sglang.srt.layers.attention.qsa.kernel.qsa_fast_topk",
    "qsa_sparse_attention": "sglang.srt.layers.attention.qsa.kernel.qsa_sparse_attention",
}
# The QSA pool's full-attention K/V reads (inherited from HybridLinearKVPool), wrapped on the CPU platform so a
# compressed sub-pool hands the sparse attention its planes (hybrid/qsa.py).
QSA_POOL_KV_READS = (
    "sglang.srt.mem_cache.qsa_kv_pool.QSATokenToKVPool.get_key_buffer",
    "sglang.srt.mem_cache.qsa_kv_pool.QSATokenToKVPool.get_value_buffer",
)
# Off the CPU platform, with a compressed (int8) pool, the same reads give the planes to SGLang's GPU sparse path,
# whose readers of the full-attention K/V are these two packers (selected slots / whole contexts -> model-dtype
# buffers), replaced (REPLACE; the backend holds `from X import Y` copies) by format-aware ones, and the extend
# without a cached prefix, which reads the fresh K/V: QSA_BACKEND_FORWARD_EXTEND (AROUND) hands it the stored
# values instead (hybrid/qsa.py).
QSA_GPU_KV_PACKERS = {
    "qwen_sparse_kv_extraction_compact_triton":
        "sglang.srt.layers.attention.qsa.sparse_attn.qwen_sparse_kv_extraction_compact_triton",
    "pack_qsa_prefill_kv": "sglang.srt.layers.attention.qsa.sparse_attn.pack_qsa_prefill_kv",
}
QSA_BACKEND_FORWARD_EXTEND = "sglang.srt.layers.attention.qwen_sparse_attn_backend.QwenSparseAttnBackend.forward_extend"
# The HiCache host mirror of the QSA indexer's compressed keys (whole full-KV pages as byte rows) moves pages with
# sgl_kernel's kvcacheio ops, imported on CUDA/HIP/XPU only; the CPU platform replaces (REPLACE) both moves with
# torch row copies (hybrid/qsa.py). Both are inherited from DeepSeekV4PagedHostPool (hooked on the QSA class only);
# HOOKED_SIGNATURES checks them through the imported class.
QSA_INDEXER_HOST_BACKUP = "sglang.srt.mem_cache.pool_host.qsa.QSAIndexerPoolHost.backup_from_device_all_layer"
QSA_INDEXER_HOST_LOAD = "sglang.srt.mem_cache.pool_host.qsa.QSAIndexerPoolHost.load_to_device_per_layer"
# DefaultPoolConfigurator's per-token bytes of the QSA index caches, added to a compressed format's cell size.
POOL_QSA_CELL_SIZE = "_compute_qsa_cell_size"
# --- speculative decoding on the portable CPU platform (sglang_ext/spec/) ----------------------------------
# Functions replaced (HookRegistry REPLACE) by torch ops: their modules import on any platform, but on an
# out-of-tree platform these functions launch Triton kernels on CPU tensors or refuse the platform.
SPEC_OPS_MODULE = "sglang.kernels.ops.speculative"
HOOK_SPEC_VERIFY_TREE_GREEDY = f"{SPEC_OPS_MODULE}.spec_tree.verify_tree_greedy_func"
HOOK_SPEC_BUILD_TREE = f"{SPEC_OPS_MODULE}.spec_tree.build_tree_kernel_efficient_func"
HOOK_SPEC_FILL_FRONT_CACHE_LOC = f"{SPEC_OPS_MODULE}.cache_locs.fill_front_out_cache_loc_func"
HOOK_SPEC_ASSIGN_DRAFT_CACHE_LOCS = f"{SPEC_OPS_MODULE}.cache_locs.assign_draft_cache_locs_contiguous_func"
HOOK_SPEC_FILL_ACCEPT_CACHE_LOC = f"{SPEC_OPS_MODULE}.eagle.fill_accept_out_cache_loc_func"
HOOK_SPEC_FILL_BONUS_TOKENS = f"{SPEC_OPS_MODULE}.eagle.fill_bonus_tokens_func"
# EAGLE/NEXTN step helpers (Triton on every platform but SGLang's AMX CPU engine); same names in sglang_ext.spec.eagle_ops.
SPEC_EAGLE_HELPERS = {
    f"{SPEC_OPS_MODULE}.eagle": ("build_chain_tree", "prepare_verify_commit_outputs", "prepare_draft_extend_inputs",
                                 "prepare_draft_extend_lengths", "prepare_draft_extend_layout"),
    f"{SPEC_OPS_MODULE}.topk1": ("draft_topk1_postprocess", "draft_topk1_argmax_only"),
}
# Rejection sampling with draft probabilities (--speculative-use-rejection-sampling): a Triton kernel everywhere.
HOOK_SPEC_CHAIN_SAMPLING = f"{SPEC_OPS_MODULE}.reject_sampling.chain_speculative_sampling_triton"
# Writes newly allocated draft slots into req_to_token (spec decode allocation; Triton off the AMX CPU engine).
HOOK_SPEC_ASSIGN_REQ_TO_TOKEN = "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func"
# TreeMaskMode values passed to build_tree_kernel_efficient_func (FULL_MASK = 0, QLEN_ONLY = 1).
SPEC_TREE_MASK_FULL, SPEC_TREE_MASK_QLEN_ONLY = 0, 1
# Module that cannot be imported without sgl_kernel's CUDA (or CPU/AMX) build: it imports
# `sgl_kernel.speculative` at module level on every platform but XPU. The CPU platform provides a module of the
# same name with the one public function NGRAM calls.
SPEC_RECONSTRUCT_TREE_MODULE = f"{SPEC_OPS_MODULE}.reconstruct_tree"
SPEC_RECONSTRUCT_TREE_FN = "reconstruct_indices_from_tree_mask_func"
# Module attributes resolved per platform at import: None on a platform without CUDA/HIP/NPU/MUSA kernels; on HIP
# the tree sampling is None too, on CUDA it is the JIT op (sampling.cuh) and renorm is FlashInfer's (a LazyImport).
SPEC_VERIFY_SAMPLING_ATTRS = {f"{SPEC_OPS_MODULE}.verify_sampling": ("tree_speculative_sampling_target_only",)}
SPEC_RENORM_ATTRS = {"sglang.kernels.ops.sampling.renorm": ("top_k_renorm_prob", "top_p_renorm_prob")}
SPEC_NONE_ATTRS = {**SPEC_VERIFY_SAMPLING_ATTRS, **SPEC_RENORM_ATTRS}
# Modules that bind those names with `from ... import` (they may be imported before the plugin loads, so their
# copies are patched too).
SPEC_NONE_ATTR_IMPORTERS = ("sglang.srt.speculative.eagle_utils", "sglang.srt.speculative.dflash_utils")
# --- speculative decoding on CUDA / HIP (sglang_ext/spec/gpu_plan.py says which op replaces which) ---
# NGRAM's tree reconstruction: imports on CUDA/HIP (JIT op), so replaced like the functions above.
HOOK_SPEC_RECONSTRUCT_TREE = f"{SPEC_RECONSTRUCT_TREE_MODULE}.{SPEC_RECONSTRUCT_TREE_FN}"
# eagle_sample asks this predicate whether to verify greedily; it answers True for every HIP run without
# --speculative-use-rejection-sampling (keyword-only: is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling).
HOOK_SPEC_VERIFY_USES_GREEDY = "sglang.srt.speculative.eagle_utils._verify_uses_greedy"
# FlashInfer, which SGLang's CUDA tree sampling (JIT headers) and renorm need.
FLASHINFER_MODULE = "flashinfer"
# TARGET_VERIFY through torch_native attention: forward_extend assumes a prefill batch.
HOOK_TORCH_NATIVE_FORWARD_EXTEND = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend")
# With speculative decoding the MHA pool warms up a Triton slot-row copy (used by move_kv_cache to move accepted
# drafts' KV); on the CPU platform the pool uses its own torch move (`use_native_move_kv_cache`) instead.
HOOK_MHA_POOL_INIT_KV_COPY = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool._init_kv_copy_and_warmup"
# EAGLE/NEXTN draft attention: the factory has no torch_native entry; sglang_ext.spec.draft_backends adds one.
HOOK_DRAFT_BACKEND_FACTORY_CREATE = "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend"
# Its Triton entries build SGLang's TritonMultiStepDraftBackend (per-step TritonAttnBackend in `attn_backends`, step
# i's kv_indptr row passed as `kv_indptr_buf`) and a plain TritonAttnBackend for draft extend; over a compressed
# pool sglang_ext.spec.draft_backends swaps in CompressedTritonAttnBackend for both.
_LAZY["TritonMultiStepDraftBackend"] = "sglang.srt.layers.attention.triton_backend:TritonMultiStepDraftBackend"
_LAZY["TorchNativeAttnBackend"] = "sglang.srt.layers.attention.torch_native_backend:TorchNativeAttnBackend"
_LAZY["KVWriteLoc"] = "sglang.srt.mem_cache.memory_pool:KVWriteLoc"
# --- SGLang's Triton kernels built ahead of time (platform/sglang_triton_targets.py) ---------------------------
# The launchers portable_gpu's served paths call (Triton attention backend, fused MoE runner, Gated DeltaNet backend);
# the ahead-of-time build calls each on CPU tensors and records the Triton launches they make.
SGLANG_TRITON_LAUNCHERS = {
    "decode_attention_fwd": "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd",
    "extend_attention_fwd": "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd",
    "invoke_fused_moe_kernel": "sglang.kernels.ops.moe.fused_moe_triton_kernels.invoke_fused_moe_kernel",
    "moe_align_small_numel": "sglang.kernels.ops.moe.moe_align_small_numel.moe_align_small_numel",
    "moe_sum_reduce_triton": "sglang.kernels.ops.moe.fused_moe_triton_kernels.moe_sum_reduce_triton",
    # Triton backend metadata: per-request KV split count, KV index gather (JIT functions, launched as kernel[grid])
    "get_num_kv_splits_triton": "sglang.kernels.ops.attention.metadata.get_num_kv_splits_triton",
    "create_flashinfer_kv_indices_triton": "sglang.kernels.ops.attention.kv_indices.create_flashinfer_kv_indices_triton",
    # Qwen3.5 layers: q/k norm + RoPE + gate (CUDA), q/k norm + gate (ROCm), output gate, GDN split, gated RMSNorm
    "fused_qk_gemma_rmsnorm_rope_gate":
        "sglang.kernels.ops.attention.fused_qk_rmsnorm_rope_gate.fused_qk_gemma_rmsnorm_rope_gate",
    "fused_qk_gemma_rmsnorm_with_gate": "sglang.srt.models.utils.fused_qk_gemma_rmsnorm_with_gate",
    **{name: GDN_KERNEL_TARGETS[name] for name in (
        "causal_conv1d_fn", "causal_conv1d_update", "fused_gdn_gating", "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule_packed_decode", "fused_sigmoid_gating_delta_rule_update",
        "fused_sigmoid_mul", "fused_qkvzba_split_reshape_cat_contiguous", "layernorm_fn")},
    # the kernels of GDN_KERNEL_TARGETS' Mamba state scatters (their launchers refuse CPU tensors)
    **{f"_{name}_kernel": f"{GDN_KERNEL_TARGETS[name].rpartition('.')[0]}._{name}_kernel" for name in (
        "fused_mamba_state_scatter_with_mask", "fused_conv_window_scatter_with_mask")},
}
# Packages whose modules read the device at import into the globals below, which pick launch parameters (block
# sizes, warps, PDL, HIP-only options); the build sets them to each target's values while it records.
SGLANG_TRITON_KERNEL_PACKAGES = ("sglang.kernels.ops.",)
SGLANG_TRITON_DEVICE_FLAGS = ("_is_hip", "_is_cuda", "CUDA_CAPABILITY", "_is_gfx95", "_is_gfx1250", "_is_sm90",
                              "_is_sm103", "_is_sm107", "is_amd", "is_nvidia", "is_nvidia_hopper",
                              "is_tf32_supported", "use_cuda_graph", "is_arch_support_pdl",
                              "custom_device_ctx", "device_context", "_get_sm_count", "_lean_num_cus")
# --- call signatures our hooks were written for (checked by tests/test_compat.py with inspect.signature) ---------
# Every SGLang function sglang-ext hooks, replaces or patches at import, as inspect.signature shows it on the
# module or class (a classmethod / staticmethod without cls), annotations dropped. A SGLang bump that changes one
# fails the compat test naming it; read the hooks of that target before updating its line.
_SPEC_EAGLE, _SPEC_TOPK1 = f"{SPEC_OPS_MODULE}.eagle", f"{SPEC_OPS_MODULE}.topk1"
HOOKED_SIGNATURES = {
    # start-up checks, CLI flags (kvcache, pp, sessions, batch-invariant export)
    HOOK_SERVER_ARGS_RESOLVE: "(self)",
    HOOK_SERVER_ARGS_ADD_CLI_ARGS: "(parser)",
    HOOK_SERVER_ARGS_FROM_CLI_ARGS: "(args)",
    # compressed KV (kvcache/hooks.py)
    HOOK_CONFIGURE_KV_CACHE_DTYPE: (
        "(*, server_args_kv_cache_dtype, model, model_dtype, is_draft_worker, is_dflash, "
        "speculative_draft_attention_backend, speculative_draft_kv_cache_dtype=None)"),
    HOOK_KV_CACHE_CONFIGURE: "(self, *, pre_model_load_memory)",
    HOOK_POOL_CELL_SIZE: "(self, kvc, num_layers)",
    HOOK_BUILD_MHA_KV_POOL: "(self, *, max_total_num_tokens, mha_pool_class, quant_method=None)",
    HOOK_HYBRID_FULL_ATTENTION_POOL_CLASS: "(self, *, mha_pool_class, mla_pool_class, dsa_pool_class)",
    HOOK_BUILD_FULL_ATTENTION_BACKEND: "(*, model_runner, backend_str, init_new_workspace)",
    # qwen4_exp's QSA indexer on the portable CPU platform (hybrid/qsa.py)
    QSA_INDEXER_FORWARD_NATIVE: "(self, *args, **kwargs)",
    f"{QSA_INDEXER_FORWARD_NATIVE.rpartition('.')[0]}.{QSA_INDEXER_FORWARD_IMPL}": (
        "(self, hidden_states, positions, forward_batch, indexer_metadata, cp_global_rope_positions=None)"),
    **{target: "(self, layer_id, scale=None)" for target in QSA_POOL_KV_READS},
    QSA_GPU_KV_PACKERS["qwen_sparse_kv_extraction_compact_triton"]: (
        "(k, v, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v, batch, topk, zero_fill_cols=0)"),
    QSA_GPU_KV_PACKERS["pack_qsa_prefill_kv"]: (
        "(*, k, v, req_to_token, req_indices, cu_k, total_k, max_k, output_dtype=None)"),
    QSA_BACKEND_FORWARD_EXTEND: (
        "(self, q, k, v, layer, forward_batch, save_kv_cache=True, topk_indices=None, **kwargs)"),
    f"{HOOK_POOL_CELL_SIZE.rpartition('.')[0]}.{POOL_QSA_CELL_SIZE}": "(*, hf_config, num_layers)",
    # HiCache (platform/host_pool.py, hicache/hooks.py)
    HOOK_GET_MHA_HOST_POOL_CLS: "(buffer_info)",
    HOOK_CREATE_STORAGE_BACKEND: "(backend_name, storage_config, mem_pool_host, **kwargs)",
    HOOK_BUILD_MAMBA_HOST_POOL: "(mamba_pool, pool_info, *, host_size, layout, mtp_draft_device_pools=())",
    # portable CPU platform: torch_native extend, seeded sampling, batch-invariant mode
    HOOK_TORCH_NATIVE_SDPA_EXTEND: (
        "(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens, "
        "extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False, causal=False, is_cross_attn=False, "
        "sliding_window_size=None)"),
    HOOK_TORCH_NATIVE_FORWARD_EXTEND: "(self, q, k, v, layer, forward_batch, save_kv_cache=True)",
    f"{TORCH_NATIVE_ATTN_BACKEND}.forward_decode": "(self, q, k, v, layer, forward_batch, save_kv_cache=True)",
    HOOK_MURMUR_HASH32: "(seed, positions, col_indices)",
    HOOK_SCHEDULE_BATCH_PREPARE_FOR_DECODE: "(self)",
    QSA_INDEXER_HOST_BACKUP: "(self, device_pool, host_indices, device_indices, io_backend)",
    QSA_INDEXER_HOST_LOAD:
        "(self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False)",
    HOOK_ENABLE_BATCH_INVARIANT_MODE: "(self)",
    HOOK_MODEL_RUNNER_FORWARD: (
        "(self, forward_batch, skip_attn_backend_init=None, pp_proxy_tensors=None, reinit_attn_backend=False, "
        "split_forward_count=1)"),
    HOOK_UNQUANTIZED_LINEAR_APPLY: "(self, layer, x, bias=None)",
    HOOK_LOGITS_COMPUTE_LM_HEAD: "(self, hidden_states, lm_head, embedding_bias=None, *, out=None)",
    # pipeline parallel: tied lm_head (pp/tied_lm_head.py)
    HOOK_LLAMA_INIT: "(self, config, quant_config=None, prefix='')",
    HOOK_LLAMA_LOAD_WEIGHTS: "(self, weights)",
    # PLE (ple/sglang_glue.py): the hook, and what the import-time patches of qwen4_exp / Gemma 3n replace or wrap
    HOOK_UPDATE_INTERMEDIATE_SIZE: "(model_config, attr_name, intermediate_padding_size)",
    # the CPU platform: an explicit head_dim on Qwen2-layer models (platform/explicit_head_dim.py)
    HOOK_QWEN2_DECODER_LAYER_INIT: (
        "(self, config, layer_id=0, start_layer=0, quant_config=None, prefix='', alt_stream=None)"),
    # the GPU platform: DualGemm without the CuTe DSL kernel (platform/hooks.py)
    HOOK_DUAL_GEMM_SELECT_MODE: "(self, gate_up_proj, hidden_size)",
    f"{QWEN4_MODULE}.{QWEN4_HOST_EMBEDDING}.__init__": "(self, embedding, *, backend='pinned', table_dir=None)",
    f"{QWEN4_MODULE}.{QWEN4_HOST_EMBEDDING}.gather": "(self, input_ids, out=None)",
    f"{QWEN4_MODULE}.{QWEN4_TOP_MODEL}.load_weights": "(self, weights)",
    f"{QWEN4_MODULE}.{QWEN4_NGRAM_EMBEDDING}.__init__": (
        "(self, config, embedding_dim, ple_layer_index=0, quant_config=None, prefix='')"),
    f"{QWEN4_MODULE}.{QWEN4_NGRAM_EMBEDDING}.forward": "(self, batch, forward_batch)",
    f"{QWEN4_MODULE}.{QWEN4_PLE_LAYER}.{QWEN4_CONSUME_PREFETCHED}": "(self, forward_batch)",
    f"{GEMMA3N_MODULE}.{GEMMA3N_TEXT_MODEL}.__init__": "(self, config, quant_config=None, prefix='')",
    # speculative decoding (spec/hooks.py): replaced ops
    HOOK_SPEC_VERIFY_TREE_GREEDY: (
        "(predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token, "
        "retrieve_next_sibling, target_predict, topk=-1)"),
    HOOK_SPEC_BUILD_TREE: (
        "(parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve_index, retrieve_next_token, "
        "retrieve_next_sibling, topk, spec_steps, num_verify_tokens, tree_mask_mode)"),
    HOOK_SPEC_FILL_FRONT_CACHE_LOC: "(num_front, out_cache_loc, front_out_cache_loc)",
    HOOK_SPEC_ASSIGN_DRAFT_CACHE_LOCS: (
        "(req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk, num_cols, positions=None, mrope=None)"),
    HOOK_SPEC_FILL_ACCEPT_CACHE_LOC: "(accept_index, out_cache_loc, accept_out_cache_loc, size)",
    HOOK_SPEC_FILL_BONUS_TOKENS: "(accept_tokens, accept_lens, bonus_tokens, accept_stride, batch_size)",
    HOOK_SPEC_CHAIN_SAMPLING: (
        "(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, "
        "retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs, "
        "threshold_single, threshold_acc, deterministic, *, block_verification=False)"),
    HOOK_SPEC_ASSIGN_REQ_TO_TOKEN: (
        "(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size)"),
    HOOK_MHA_POOL_INIT_KV_COPY: "(self)",
    HOOK_DRAFT_BACKEND_FACTORY_CREATE: "(self, backend_name, backend_map, error_template, stamps_children=False)",
    HOOK_SPEC_VERIFY_USES_GREEDY: "(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling)",
    # EAGLE/NEXTN step helpers (SPEC_EAGLE_HELPERS)
    f"{_SPEC_EAGLE}.build_chain_tree": (
        "(bonus_tokens, draft_tokens, seq_lens, tree_mask_buf=None, req_pool_indices=None, req_to_token=None, "
        "with_mrope=False)"),
    f"{_SPEC_EAGLE}.prepare_verify_commit_outputs": (
        "(predict, accept_index, accept_lens, seq_lens, num_draft_tokens=0, mamba_track_interval=0)"),
    f"{_SPEC_EAGLE}.prepare_draft_extend_inputs": "(accept_lens, predict, num_draft_tokens)",
    f"{_SPEC_EAGLE}.prepare_draft_extend_lengths": "(seq_lens, num_draft_tokens, front_offset)",
    f"{_SPEC_EAGLE}.prepare_draft_extend_layout": "(seq_lens, num_draft_tokens, with_mrope)",
    f"{_SPEC_TOPK1}.draft_topk1_postprocess": "(next_token_logits, positions, draft_tokens=None, draft_token_column=0)",
    f"{_SPEC_TOPK1}.draft_topk1_argmax_only": "(next_token_logits)",
    # Import-time patches (spec/hooks.py): the module provided on the CPU platform (its source imports sgl_kernel,
    # so the test reads this one from the source text), and the definitions SGLang binds the patched module
    # attributes to on CUDA (tree sampling) and HIP (renorm; FlashInfer's on CUDA).
    HOOK_SPEC_RECONSTRUCT_TREE: (
        "(tree_mask, verified_seq_len, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, "
        "batch_size, draft_token_num)"),
    f"{SPEC_OPS_MODULE}.sampling.tree_speculative_sampling_target_only": (
        "(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, "
        "retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs, "
        "threshold_single=1.0, threshold_acc=1.0, deterministic=True)"),
    "sglang.kernels.ops.sampling.renorm_triton.top_k_renorm_probs_triton": "(probs, top_k)",
    "sglang.kernels.ops.sampling.renorm_triton.top_p_renorm_probs_triton": "(probs, top_p)",
    # qwen4_exp's QSA steps replaced on the CPU platform (QSA_KERNEL_TARGETS)
    "sglang.srt.layers.attention.qsa.kernel.gather_qsa_compressed_keys": (
        "(compressed, token_slot_table, cu_blocks, total_blocks, max_blocks, compress_ratio)"),
    "sglang.srt.layers.attention.qsa.kernel.qsa_fast_topk": "(logits, row_starts, row_ends, topk)",
    "sglang.srt.layers.attention.qsa.kernel.qsa_sparse_attention": (
        "(q, k_cache, v_cache, token_slots, softmax_scale=None)"),
    # hybrid GDN models on the CPU platform (sglang_ext/hybrid/): the replaced Triton kernels
    "sglang.kernels.ops.attention.fla.chunk.chunk_gated_delta_rule": (
        "(q, k, v, g, beta, scale=None, initial_state=None, initial_state_indices=None, cu_seqlens=None, "
        "head_first=False, use_qk_l2norm_in_kernel=False, inplace_update=True)"),
    "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent.fused_sigmoid_gating_delta_rule_update": (
        "(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source, "
        "initial_state_indices, scale=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None, is_kda=False, "
        "lower_bound=None, disable_state_update=False, intermediate_states_buffer=None, "
        "intermediate_state_indices=None, cache_steps=None, retrieve_parent_token=None, cache_ring=False, "
        "replayssm_rawv=None, replayssm_rawk=None, replayssm_g=None, replayssm_beta=None, match_cutedsl_decode=False)"),
    "sglang.kernels.ops.attention.fla.fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode": (
        "(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices, "
        "use_qk_l2norm_in_kernel=False)"),
    "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_fn": (
        "(x, weight, bias, conv_states, query_start_loc, seq_lens_cpu, cache_indices=None, has_initial_state=None, "
        "activation='silu', pad_slot_id=-1, validate_data=False, block_table=None, **kwargs)"),
    "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update": (
        "(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None, "
        "num_accept_tokens=None, intermediate_conv_window=None, intermediate_state_indices=None, "
        "retrieve_next_token=None, retrieve_next_sibling=None, retrieve_parent_token=None, pad_slot_id=-1, "
        "metadata=None, validate_data=False)"),
    "sglang.kernels.ops.attention.linear.fused_gdn_gating.fused_gdn_gating": (
        "(A_log, a, b, dt_bias, beta=1.0, threshold=20.0)"),
    "sglang.kernels.ops.attention.triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat": (
        "(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v)"),
    "sglang.kernels.ops.attention.triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat_contiguous": (
        "(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v)"),
    "sglang.kernels.ops.elementwise.elementwise.fused_sigmoid_mul": "(attn_output, gate, inplace=False, quant=False)",
    "sglang.kernels.ops.elementwise.elementwise.fused_gate_sigmoid_mul": "(hidden_states, gate_weight, shared_output)",
    "sglang.kernels.ops.elementwise.elementwise.fused_gate_sigmoid_mul_add": (
        "(hidden_states, gate_weight, shared_output, final_hidden_states)"),
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_mamba_state_scatter_with_mask": (
        "(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None)"),
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_with_mask": (
        "(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None)"),
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_multi": (
        "(pairs, dst_indices_raw, step_indices_raw, dst_indices2_raw=None, step_indices2_raw=None)"),
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton.track_mamba_states_if_needed": (
        "(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size, "
        "check_freed_slots=False)"),
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton.track_mamba_states_all_layers": (
        "(conv_states_pool, ssm_states_pool, cache_indices, mamba_track_mask, mamba_track_indices, batch_size, "
        "check_freed_slots=False)"),
    "sglang.kernels.ops.attention.fla.layernorm_gated.layernorm_fn": (
        "(x, weight, bias, z=None, eps=1e-06, group_size=None, norm_before_gate=True, is_rms_norm=False, "
        "activation='swish')"),
}
# ------------------------------------------------------------------------------------------------------------


# --- paged MoE experts (sglang_ext/moe/sglang_glue.py) ------------------------------------------------------------
# SGLang's --enable-paged-experts: its host store (pins memory), runner contracts (triton / Marlin), the expert
# format table, the per-layer factory and the wave planner of its LRU residency.
PAGED_EXPERTS_MODULE = "sglang.srt.layers.moe.paged_experts"
HOOK_PAGED_STORE_INIT = f"{PAGED_EXPERTS_MODULE}.store.HostExpertStore.__init__"
HOOK_PAGED_CONTRACT_FOR = f"{PAGED_EXPERTS_MODULE}.runners.contract_for"
# the base class's (UnquantizedFormat inherits it; the glue wraps only for UnquantizedFormat)
HOOK_PAGED_UNQUANT_RUNNER_METHOD = f"{PAGED_EXPERTS_MODULE}.formats.ExpertFormat.runner_method"
HOOK_PAGED_MAKE_FOR_LAYER = f"{PAGED_EXPERTS_MODULE}.method.make_for_layer"
HOOK_PAGED_AFTER_LOADING = f"{PAGED_EXPERTS_MODULE}.method.PagedExpertsMoEMethod.process_weights_after_loading"
HOOK_PAGED_PLAN_WAVES = f"{PAGED_EXPERTS_MODULE}.residency.plan_waves"
# check_paged_experts_compat raises one RuntimeError: this prefix, then its problems joined by "; ". Those listed
# here are lifted (sglang_ext/moe/sglang_glue.py), word for word as SGLang 0.5.23 writes them.
HOOK_PAGED_CHECK_COMPAT = f"{PAGED_EXPERTS_MODULE}.method.check_paged_experts_compat"
PAGED_REFUSAL_PREFIX = "Paged experts: "
PAGED_LIFTED_REFUSALS: tuple[str, ...] = ("--tp-size must be 1 (single GPU only)",
                                          "--pp-size must be 1 (single GPU only)")
# lifted only for these algorithms (as get_spec() names them: SGLang resolves NEXTN to EAGLE)
PAGED_SPEC_REFUSAL = "speculative decoding is not supported"
PAGED_SPEC_ALGORITHMS = ("EAGLE",)
_LAZY["PagedTritonContract"] = f"{PAGED_EXPERTS_MODULE}.runners:TritonContract"
_LAZY["PagedUnquantizedFormat"] = f"{PAGED_EXPERTS_MODULE}.formats:UnquantizedFormat"
_LAZY["StandardCombineInput"] = "sglang.srt.layers.moe.token_dispatcher:StandardCombineInput"
HOOKED_SIGNATURES.update({
    HOOK_PAGED_STORE_INIT: "(self, layer, names, num_experts, pin=True)",
    HOOK_PAGED_CONTRACT_FOR: "(runner)",
    HOOK_PAGED_UNQUANT_RUNNER_METHOD: "(self, base_method)",
    HOOK_PAGED_MAKE_FOR_LAYER: "(layer, base_method)",
    HOOK_PAGED_AFTER_LOADING: "(self, layer)",
    HOOK_PAGED_PLAN_WAVES: "(policy, distinct)",
    HOOK_PAGED_CHECK_COMPAT: "(layer, expert_format)",
})

def set_hicache_host_memory_reserve(nbytes: int) -> None:
    """SGLang keeps 10 GiB of host RAM out of reach of the HiCache host pool (a module constant read at each
    sizing call, `pool_host/base.py`). Sized for GPU servers; the CPU platform lowers it."""
    module = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    if not hasattr(module, "HICACHE_HOST_MEMORY_RESERVE_BYTES"):
        raise RuntimeError("sglang internals changed: pool_host.base.HICACHE_HOST_MEMORY_RESERVE_BYTES is gone")
    module.HICACHE_HOST_MEMORY_RESERVE_BYTES = nbytes


def hicache_file_storage_dir(storage_config, default: str) -> str:
    """The directory HiCacheFile stores pages in (its own precedence: env, extra_config, default)."""
    from sglang.srt.environ import envs

    return (
        envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.get()
        or (storage_config.extra_config or {}).get("file_storage_path")
        or default
    )


def anchor_host_pool(mem_pool_host):
    """The KV host pool behind what the cache controller holds (a HostPoolGroup or the pool itself), and the
    number of host pools that share its storage keys (1 unless the model has side pools: Mamba, SWA, ...)."""
    entries = getattr(mem_pool_host, "entries", None)
    if entries is None:
        return mem_pool_host, 1
    return mem_pool_host.anchor_entry.host_pool, len(entries)


# --- hooks verified at start-up (sglang_ext/hook_check.py) ------------------------------------------------------
# load_plugins() runs every general plugin, then HookRegistry.apply_hooks(): it imports each target's module
# (pkgutil.resolve_name, so nothing is applied lazily), patches it, and for a target that fails only logs the
# exception and goes on; the targets it patched are in the class attribute `_patched`. No plugin code runs after
# it inside load_plugins(), so sglang-ext wraps apply_hooks to check its own targets right then.
def _hook_registry():
    return globals().get("HookRegistry") or __getattr__("HookRegistry")


def hook_targets_applied(registry=None) -> set[str]:
    """The dotted targets HookRegistry has patched in this process."""
    registry = registry or _hook_registry()
    return set(registry._patched)


def run_after_apply_hooks(fn, registry=None) -> None:
    """Make every later `registry.apply_hooks()` call fn() once it has applied the hooks (once per registry)."""
    registry = registry or _hook_registry()
    applied = registry.__dict__["apply_hooks"].__func__  # a classmethod
    if getattr(applied, "sglang_ext_after", None) is not None:
        return

    def apply_hooks(cls):
        applied(cls)
        fn()

    apply_hooks.sglang_ext_after = fn
    registry.apply_hooks = classmethod(apply_hooks)


def installed_sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
