"""Plan once per batch: CompressedTritonAttnBackend (SGLang's real constructor and metadata code, CPU tensors,
kernels under the Triton interpreter) makes one decode plan per batch from sequence lengths, and under CUDA-graph
capture / replay metadata (SGLang's preallocated buffers) gives the eager result.

The GPU-only parts (compiled kernels, CUDA graphs proper) do not run here: a graph is emulated by what it is made of,
the capture-time metadata call, the replay-time metadata call that refills the preallocated buffers in place, and
the layer call as captured (the plan made at capture). Launch choices for an H200 are checked with its facts as a
DeviceInfo (kernels/device.py) and the compiled kernels' occupancy as a fixed number: the boundary the planner asks.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from sglang_ext import compat
from sglang_ext.kernels import decode_plan, store_kv
from sglang_ext.kernels.device import DeviceInfo
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvformats import get_format, reference

H_Q, H_KV, D = 8, 2, 128
CONTEXT = 16384  # SGLang's CUDA-graph kv_indices buffer is max batch x this
SIZE, MAX_BS = 512, 4
H200 = DeviceInfo(vendor="cuda", interpreted=False, capability=(9, 0), sms=132)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """A server context (ServerArgs for the triton backend on the CPU) and a model config with this test's heads."""
    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    folder = tmp_path_factory.mktemp("llama")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H_Q * D, "head_dim": D,
        "num_attention_heads": H_Q, "num_key_value_heads": H_KV, "num_hidden_layers": 2, "intermediate_size": 256,
        "vocab_size": 256, "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}))
    args = ServerArgs(model_path=str(folder), skip_tokenizer_init=True, device="cpu", attention_backend="triton",
                      kv_cache_dtype="int8", context_length=CONTEXT, dtype="float32")
    ctx = runtime_context.create_context(args, role="scheduler")
    with runtime_context.use_context(ctx):
        yield SimpleNamespace(ctx=runtime_context, model_config=ModelConfig.from_server_args(args))


def make_backend(runtime, name: str):
    """The real CompressedTritonAttnBackend over a 2-layer pool of `name`, with SGLang's request-to-token table,
    allocator and KV index translator."""
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_ext.kvcache.triton_backend import CompressedTritonAttnBackend

    pool = CompressedMHATokenToKVPool(
        SIZE, page_size=1, dtype=torch.float32, head_num=H_KV, head_dim=D, layer_num=2, device="cpu",
        enable_memory_saver=False, v_head_dim=D, start_layer=0, end_layer=1, enable_alt_stream=False,
        enable_kv_cache_copy=True, kv_format=get_format(name, D))  # fmt: skip
    req_to_token = ReqToTokenPool(size=MAX_BS + 2, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", pool, need_sort=False)
    translator = KVIndexTranslator(req_to_token=req_to_token.req_to_token, token_to_kv_pool_allocator=allocator,
                                   token_to_kv_pool=pool, page_size=1, device="cpu", is_draft_worker=False)
    runner = SimpleNamespace(
        req_to_token_pool=req_to_token, token_to_kv_pool=pool, token_to_kv_pool_allocator=allocator, page_size=1,
        kv_index_translator=translator, sliding_window_size=None, model_config=runtime.model_config, device="cpu",
        gpu_id=0, is_draft_worker=False, spec_algorithm=SpeculativeAlgorithm.NONE, dtype=torch.float32,
        decode_num_tokens_per_req=lambda **kw: 1)
    return CompressedTritonAttnBackend(runner)


def decode_batch(backend, reqs: list[int], lens: list[int], *, host_lens: bool = True, sum_known: bool = True):
    """A decode ForwardBatch stand-in with SGLang's fields for these requests (their slots already in the table),
    bound to a KV-location plan by SGLang's translator as ForwardBatch.init_new does."""
    seq_lens = torch.tensor(lens, dtype=torch.int64)
    fb = SimpleNamespace(
        forward_mode=compat.ForwardMode.DECODE, batch_size=len(reqs), req_pool_indices=torch.tensor(reqs),
        seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone() if host_lens else None,
        seq_lens_sum=int(sum(lens)) if sum_known and host_lens else None, spec_info=None, encoder_lens=None,
        out_cache_loc=torch.tensor([int(backend.req_to_token[r, n - 1]) for r, n in zip(reqs, lens, strict=True)]))
    translator = backend.kv_index_translator
    translator.own_plan(fb).bind(fb, translator)
    return fb


def fill(backend, gen, lens: list[int]) -> list[int]:
    """Requests 1..n with lens[i] tokens each at random slots, K/V stored in both layers; returns their ids."""
    slots = torch.randperm(SIZE - 1, generator=gen)[:sum(lens)] + 1
    reqs, at = [], 0
    for i, n in enumerate(lens):
        backend.req_to_token[i + 1, :n] = slots[at:at + n]
        reqs.append(i + 1)
        at += n
    for layer in (0, 1):
        store_kv(backend.kv_format, backend.kv_pool.layer_planes(layer), slots,
                 torch.randn(len(slots), H_KV, D, generator=gen), torch.randn(len(slots), H_KV, D, generator=gen))
    return reqs


def layer(layer_id: int):
    return SimpleNamespace(layer_id=layer_id, tp_q_head_num=H_Q, tp_k_head_num=H_KV, tp_v_head_num=H_KV,
                           qk_head_dim=D, v_head_dim=D, scaling=D ** -0.5, logit_cap=0.0, sliding_window_size=None,
                           logit_capping_method=None, is_cross_attention=False, attn_type=compat.AttentionType.DECODER,
                           k_scale=None, v_scale=None)


def run_layers(backend, fb, q):
    return [backend.forward_decode(q, None, None, layer(i), fb, save_kv_cache=False) for i in (0, 1)]


def reference_decode(backend, reqs, lens, q, layer_id):
    planes = backend.kv_pool.layer_planes(layer_id)
    kv_indices = torch.cat([backend.req_to_token[r, :n] for r, n in zip(reqs, lens, strict=True)]).long()
    kv_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return reference.decode_attention(backend.kv_format, q.view(-1, H_Q, D), planes, kv_indptr, kv_indices,
                                      D ** -0.5).reshape(q.shape[0], -1)


@pytest.mark.parametrize("name", ["int8", "octave_k3v4"])
def test_graph_capture_and_replay_metadata_give_the_eager_result(runtime, name):
    gen = torch.Generator().manual_seed(3)
    backend = make_backend(runtime, name)
    lens = [37, 5, 70]
    reqs = fill(backend, gen, lens)
    q = torch.randn(len(lens), H_Q * D, generator=gen)

    fb = decode_batch(backend, reqs, lens)
    backend.init_forward_metadata(fb)
    eager_plan = backend._decode_plan
    eager = run_layers(backend, fb, q)
    for i in (0, 1):
        ref = reference_decode(backend, reqs, lens, q, i)
        err = (eager[i] - ref).abs().max().item()
        assert err < 2e-3, f"{name} layer {i}: eager decode differs from the reference by {err}"

    # CUDA graphs: buffers preallocated for MAX_BS requests x CONTEXT tokens; capture with the bucket's dummy batch
    # (SGLang fills seq lens with get_cuda_graph_seq_len_fill_value() and request 0), replay with the real one
    # padded to the bucket the same way
    backend.init_cuda_graph_state(MAX_BS, MAX_BS)
    assert backend.cuda_graph_kv_indices.shape[0] == MAX_BS * CONTEXT
    fill_len = backend.get_cuda_graph_seq_len_fill_value()
    capture = decode_batch(backend, [0] * MAX_BS, [fill_len] * MAX_BS, host_lens=False)
    backend.init_forward_metadata_out_graph(capture, in_capture=True)
    captured_plan = backend._decode_plan
    assert captured_plan.batch == MAX_BS and captured_plan.grid_splits == backend.max_kv_splits
    pad = MAX_BS - len(lens)
    replay = decode_batch(backend, reqs + [0] * pad, lens + [fill_len] * pad, host_lens=False)
    backend._decode_plan = None  # a replay runs the captured launches: the plan must come back from the capture
    backend.init_forward_metadata_out_graph(replay, in_capture=False)
    assert backend._decode_plan is captured_plan
    q_padded = torch.cat([q, torch.zeros(pad, H_Q * D)])
    graph = run_layers(backend, replay, q_padded)
    for i in (0, 1):
        assert graph[i].shape == (MAX_BS, H_Q * D)
        diff = (graph[i][:len(lens)] - eager[i]).abs().max().item()
        assert diff < 1e-5, f"{name} layer {i}: the graph's metadata gives {diff} away from eager decode"
    assert eager_plan.batch == len(lens)


@pytest.fixture
def on_h200(monkeypatch):
    """The planner sees an H200 (its facts, and the compiled kernels' resident programs per SM as measured there:
    decode_mma 12, the Triton stage 1 4); nothing is launched."""
    monkeypatch.setattr(decode_plan, "device_info", lambda device: H200)
    monkeypatch.setattr(decode_plan, "_resident_mma", lambda *a, **kw: 12)
    monkeypatch.setattr(decode_plan, "_resident_triton", lambda *a, **kw: 4)


def test_int8_stage1_follows_the_lengths_not_the_kv_indices_buffer(runtime, on_h200):
    # int8 takes the Gluon stage 1 from a mean length of MMA_INT8_MIN_TOKENS (8k) only. SGLang's eager decode
    # metadata over-allocates kv_indices to batch x context length when seq_lens_sum is not set, and a CUDA graph's
    # buffer is max batch x context length: a rule reading kv_indices.shape[0] took the 8k+ path for 4k requests.
    from sglang_ext.kernels.launch_table import MMA_INT8_MIN_TOKENS

    backend = make_backend(runtime, "int8")
    backend.req_to_token[1:3].fill_(1)  # only planned here: any slots do
    for mean, expect in ((MMA_INT8_MIN_TOKENS // 2, "triton"), (MMA_INT8_MIN_TOKENS, "mma")):
        lens = [mean - 1, mean + 1]
        for sum_known in (True, False):  # seq_lens_sum, or only seq_lens_cpu (then kv_indices is over-allocated)
            fb = decode_batch(backend, [1, 2], lens, sum_known=sum_known)
            backend.init_forward_metadata(fb)
            plan = backend._decode_plan
            kv_indices_size = backend.forward_metadata.kv_indices.shape[0]
            assert kv_indices_size == (sum(lens) if sum_known else 2 * CONTEXT)
            assert plan.stage1 == expect, (lens, sum_known, kv_indices_size, plan.stage1)
            assert plan.grid_splits == backend.max_kv_splits * plan.split_mul
    # capture: the lengths are unknown, the choice holds for every replay of the bucket: the long-context one
    capture = SimpleNamespace(forward_mode=compat.ForwardMode.DECODE, batch_size=2, spec_info=None)
    assert backend.plan_batch(capture, None).stage1 == "mma"


def test_plan_splits_without_caller_counts_come_from_lengths(on_h200, monkeypatch):
    # a verify step (SGLang passes no split counts): wave_splits over the mean length, never a buffer's size. One
    # resident program per SM (132 slots) at batch 32 x 2 KV heads: 4k requests fill a wave with 2 splits, 32k
    # ones take 8 (decode.wave_splits' cost model); unknown lengths (a graph capture) take max_kv_splits.
    from sglang_ext.kernels.decode import DEFAULT_MAX_KV_SPLITS, wave_splits

    monkeypatch.setattr(decode_plan, "_resident_triton", lambda *a, **kw: 1)
    fmt = get_format("octave_k3v4", D)
    planes = fmt.allocate(8, H_KV, "cpu")

    def plan(seq_lens_sum):
        return decode_plan.plan_decode(fmt, planes, batch=32, num_q_heads=H_Q, q_dtype=torch.bfloat16,
                                       seq_lens_sum=seq_lens_sum, q_len=4, kv_splits_given=False)

    short, long, unknown = plan(32 * 4096), plan(32 * 32768), plan(None)
    assert short.stage1 == long.stage1 == "triton"  # q_len 4: the Gluon kernel takes one query token
    block_n = short.consts["BLOCK_N"]
    assert (short.grid_splits, long.grid_splits) == (2, 8) == (
        wave_splits(64, DEFAULT_MAX_KV_SPLITS, 132, 4096, block_n), wave_splits(64, DEFAULT_MAX_KV_SPLITS, 132, 32768,
                                                                                block_n))
    assert unknown.grid_splits == DEFAULT_MAX_KV_SPLITS
    for p in (short, long, unknown):
        assert p.num_kv_splits.tolist() == [p.grid_splits] * 32


def extend_batch(backend, reqs: list[int], prefix: list[int], ext: list[int], *, host_prefix: bool):
    """An extend ForwardBatch stand-in: request i has prefix[i] cached tokens and ext[i] new ones (all slots already
    in the table). host_prefix=False leaves extend_prefix_lens_cpu unset, as SGLang's gpu_only batches do: its
    metadata then allocates kv_indices to batch x context length."""
    seq = [p + e for p, e in zip(prefix, ext, strict=True)]
    seq_lens = torch.tensor(seq)
    fb = SimpleNamespace(
        forward_mode=compat.ForwardMode.EXTEND, batch_size=len(reqs), req_pool_indices=torch.tensor(reqs),
        seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(), seq_lens_sum=sum(seq),
        extend_prefix_lens=torch.tensor(prefix), extend_prefix_lens_cpu=list(prefix) if host_prefix else None,
        extend_seq_lens=torch.tensor(ext), extend_seq_lens_cpu=list(ext), spec_info=None, encoder_lens=None,
        out_cache_loc=torch.cat([backend.req_to_token[r, p:p + e] for r, p, e in zip(reqs, prefix, ext, strict=True)]))
    translator = backend.kv_index_translator
    translator.own_plan(fb).bind(fb, translator)
    return fb


def test_extend_prefix_scratch_follows_the_lengths_not_the_kv_indices_buffer(runtime, monkeypatch):
    # The prefix scratch (kernels/extend.py) is sized, and decided, from the batch's prefix lengths. Without host
    # prefix lengths SGLang's extend metadata allocates kv_indices to batch x context length (32768 rows here, 65
    # of them the batch's): a rule reading kv_indices.shape[0] sized the scratch 32768 rows and, over a budget of
    # exactly the batch's 65 rows, split or refused it. A CUDA-graph capture (lengths unknown) runs the direct
    # kernel.
    from sglang_ext.kernels import extend as extend_mod
    from sglang_ext.kernels import extend_plan
    from sglang_ext.kvcache.new_token_reads import extend_reads_pool

    gen = torch.Generator().manual_seed(5)
    backend = make_backend(runtime, "int8")
    prefix, ext = [40, 25], [70, 3]  # 70 new tokens: two query blocks of 64 (d128, group 4), the scratch rule's
    reqs = fill(backend, gen, [p + e for p, e in zip(prefix, ext, strict=True)])
    budget = sum(prefix) * H_KV * D * 4 * 2  # float32 K and V of every KV head
    monkeypatch.setattr(extend_plan, "SCRATCH_BYTES", budget)
    calls = []
    real = extend_mod.dequantize_rotated

    def spy(fmt, planes, loc, k_out, v_out, head_base=0, **kw):
        calls.append((head_base, k_out.shape[1], k_out.shape[0]))
        return real(fmt, planes, loc, k_out, v_out, head_base=head_base, **kw)

    monkeypatch.setattr(extend_mod, "dequantize_rotated", spy)
    t = sum(ext)
    q = torch.randn(t, H_Q * D, generator=gen)
    k, v = torch.randn(t, H_KV * D, generator=gen), torch.randn(t, H_KV * D, generator=gen)
    for host_prefix in (True, False):
        fb = extend_batch(backend, reqs, prefix, ext, host_prefix=host_prefix)
        backend.init_forward_metadata(fb)
        md = backend.forward_metadata
        assert md.kv_indices.shape[0] == (sum(prefix) if host_prefix else 2 * CONTEXT)
        plan = backend._extend_plan
        assert plan.prefix_rows == sum(prefix) and plan.scratch == ((0, H_KV),), (host_prefix, plan)
        calls.clear()
        o = backend.forward_extend(q, k, v, layer(0), fb)
        assert calls[0] == (0, H_KV, sum(prefix)), f"host_prefix={host_prefix}: prefix scratch calls {calls}"
        planes = backend.kv_pool.layer_planes(0)
        prefix_slots = torch.cat([backend.req_to_token[r, :p] for r, p in zip(reqs, prefix, strict=True)]).long()
        ref = reference.extend_attention(
            backend.kv_format, q.view(t, H_Q, D), k.view(t, H_KV, D), v.view(t, H_KV, D), planes,
            torch.tensor([0, *torch.tensor(ext).cumsum(0).tolist()]), torch.tensor([0, *torch.tensor(prefix).cumsum(0).tolist()]),
            prefix_slots, D ** -0.5, new_slots=fb.out_cache_loc if extend_reads_pool() else None)
        err = (o.view(t, H_Q, D) - ref).abs().max().item()
        assert err < 1e-4, f"host_prefix={host_prefix}: extend differs from the reference by {err}"
    # the lengths unknown when the plan is made (a CUDA-graph capture): the direct kernel, no buffer sized by them
    assert backend.plan_extend_batch(fb, None).scratch is None


def test_draft_decode_rows_plan_from_their_requests_lengths(runtime, on_h200):
    # A multi-step draft step (topk 2) gives topk kv rows per request, each as long as its request: the plan's mean
    # length is the requests' (8k here: int8 takes the Gluon stage 1), not seq_lens_sum spread over the rows (4k).
    from sglang_ext.kernels.launch_table import MMA_INT8_MIN_TOKENS

    backend = make_backend(runtime, "int8")
    topk, requests = 2, 2
    draft = SimpleNamespace(forward_mode=compat.ForwardMode.DECODE, batch_size=requests,
                            spec_info=SimpleNamespace(kv_indptr=torch.zeros(requests * topk + 1, dtype=torch.int32)))
    plan = backend.plan_batch(draft, requests * MMA_INT8_MIN_TOKENS)
    assert plan.batch == requests * topk and plan.stage1 == "mma", plan
    assert backend.plan_batch(draft, requests * MMA_INT8_MIN_TOKENS // 2).stage1 == "triton"
