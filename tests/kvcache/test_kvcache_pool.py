"""In-process checks of the glue: the compressed pool, memory sizing, batch slot lists and start-up refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_ext import compat, platform
from sglang_ext.kvcache import hooks, support
from sglang_ext.kvcache.batch_plan import plan_decode, plan_extend
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES, resolve_kv_format
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvformats import get_format

HEADS, DIM, LAYERS, SIZE = 3, 64, 2, 40


def make_pool(name: str, layers: int = LAYERS) -> CompressedMHATokenToKVPool:
    return CompressedMHATokenToKVPool(
        SIZE,
        page_size=1,
        dtype=torch.float32,
        head_num=HEADS,
        head_dim=DIM,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
        v_head_dim=DIM,
        start_layer=0,
        end_layer=layers - 1,
        enable_alt_stream=False,
        enable_kv_cache_copy=False,
        kv_format=get_format(name, DIM, DIM),
    )


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_pool_stores_exactly_the_format_codes_at_the_slots(name):
    pool = make_pool(name)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(6, HEADS, DIM, generator=gen)
    v = torch.randn(6, HEADS, DIM, generator=gen)
    loc = torch.tensor([1, 4, 5, 17, 30, SIZE])
    expected = pool.kv_format.quantize(k, v)
    planes = pool.layer_planes(1)
    assert any(not torch.equal(planes[n][loc], expected[n]) for n in expected), "destination already equals source"
    before_layer0 = {n: t.clone() for n, t in pool.layer_planes(0).items()}
    before = {n: t.clone() for n, t in planes.items()}

    pool.set_kv_buffer(SimpleNamespace(layer_id=1), loc, k, v)

    untouched = torch.ones(SIZE + 1, dtype=torch.bool)
    untouched[loc] = False
    for n, t in planes.items():
        assert torch.equal(t[loc], expected[n]), f"{name}: plane {n} differs from fmt.quantize at the written slots"
        assert torch.equal(t[untouched], before[n][untouched]), f"{name}: plane {n} changed outside the written slots"
        assert torch.equal(pool.layer_planes(0)[n], before_layer0[n]), f"{name}: layer 0 plane {n} changed"


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_pool_moves_every_plane_and_counts_its_bytes(name):
    pool = make_pool(name)
    gen = torch.Generator().manual_seed(1)
    for layer in range(LAYERS):
        pool.set_kv_buffer(
            SimpleNamespace(layer_id=layer),
            torch.arange(1, 9),
            torch.randn(8, HEADS, DIM, generator=gen),
            torch.randn(8, HEADS, DIM, generator=gen),
        )
    src, dst = torch.tensor([1, 2, 3]), torch.tensor([20, 21, 22])
    assert not torch.equal(pool.layer_planes(0)["k_codes"][dst], pool.layer_planes(0)["k_codes"][src])
    pool.move_kv_cache(dst, src)
    for layer in range(LAYERS):
        for n, t in pool.layer_planes(layer).items():
            assert torch.equal(t[dst], t[src]), f"{name}: layer {layer} plane {n} not moved"
    k_bytes, v_bytes = pool.get_kv_size_bytes()
    expected = (SIZE + 1) * HEADS * LAYERS * pool.kv_format.bytes_per_token_head
    assert k_bytes + v_bytes == expected, f"{name}: pool holds {k_bytes + v_bytes} B, expected {expected} B"


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_pool_without_layers_describes_its_planes(name):
    # A pipeline stage of a hybrid model that holds only linear-attention layers builds its full-attention pool
    # with no layer; the Triton backend still plans each decode batch from the pool's plane geometry.
    from sglang_ext.kernels.decode_plan import plan_decode as plan_decode_kernel

    pool = make_pool(name, layers=0)
    planes = pool.first_layer_planes()
    like = make_pool(name).first_layer_planes()
    assert {n: (t.shape[1:], t.dtype) for n, t in planes.items()} == {n: (t.shape[1:], t.dtype) for n, t in like.items()}
    assert all(t.shape[0] == 0 for t in planes.values()), "a pool without layers allocated slots"
    assert pool.get_kv_size_bytes() == (0, 0)
    plan = plan_decode_kernel(pool.kv_format, planes, batch=2, num_q_heads=2 * HEADS, q_dtype=torch.float32,
                              seq_lens_sum=40)
    assert (plan.num_kv_heads, plan.head_dim) == (HEADS, DIM)


def test_pool_refuses_dense_reads():
    pool = make_pool("int8")
    with pytest.raises(NotImplementedError, match="no dense K/V buffer"):
        pool.get_key_buffer(0)
    with pytest.raises(NotImplementedError, match="no dense K/V buffer"):
        pool.get_kv_buffer(1)


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_cell_size_uses_the_format_bytes(name, monkeypatch):
    monkeypatch.setattr(compat, "get_parallel", lambda: SimpleNamespace(attn_tp_size=1, attn_dcp_size=1))
    kvc = SimpleNamespace(
        kv_cache_dtype_str=name,
        model_config=SimpleNamespace(
            head_dim=DIM, v_head_dim=DIM, model_path="m", hf_text_config=SimpleNamespace(), hf_config=SimpleNamespace(),
            get_num_kv_heads=lambda tp, dcp: HEADS,
        ),
    )  # fmt: skip
    fmt = get_format(name, DIM, DIM)
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    configurator = SimpleNamespace(_compute_qsa_cell_size=DefaultPoolConfigurator._compute_qsa_cell_size)  # 0: no QSA
    cell = hooks._compute_cell_size(lambda *a: pytest.fail("fell through to SGLang's cell size"), configurator, kvc, 30)
    assert cell == HEADS * 30 * fmt.bytes_per_token_head, f"{name}: cell size {cell}"
    bf16_cell = HEADS * 30 * 2 * DIM * 2
    assert bf16_cell / cell > 1.8, f"{name}: capacity gain x{bf16_cell / cell:.2f} over bf16"


def test_other_dtypes_fall_through_to_sglang():
    sentinel = object()
    kvc = SimpleNamespace(kv_cache_dtype_str="fp8_e4m3")
    assert hooks._compute_cell_size(lambda *a: sentinel, None, kvc, 30) is sentinel
    assert hooks._configure_kv_cache_dtype(lambda **kw: sentinel, server_args_kv_cache_dtype="auto") is sentinel
    resolved = hooks._configure_kv_cache_dtype(
        lambda **kw: pytest.fail("fell through"), server_args_kv_cache_dtype="octave_k3v3", model_dtype=torch.bfloat16
    )
    assert resolved == ("octave_k3v3", torch.bfloat16)


def test_batch_plans_list_each_sequences_slots():
    req_to_token = torch.arange(100).view(4, 25) + 1000  # row r holds slots 1000 + 25 r ...
    dec = plan_decode(req_to_token, [2, 0], [3, 5])
    assert dec.kv_indptr.tolist() == [0, 3, 8]
    assert dec.kv_indices.tolist() == [1050, 1051, 1052, 1000, 1001, 1002, 1003, 1004]
    assert dec.qo_indptr.tolist() == [0, 1, 2]
    ext = plan_extend(req_to_token, [1, 3], prefix_lens=[0, 2], extend_lens=[4, 3])
    assert ext.qo_indptr.tolist() == [0, 4, 7]
    assert ext.kv_indptr.tolist() == [0, 0, 2]
    assert ext.kv_indices.tolist() == [1075, 1076]


def fake_configurator(**overrides):
    server_args = SimpleNamespace(
        enable_hierarchical_cache=False, hicache_mem_layout="layer_first", disaggregation_mode="null",
        speculative_algorithm=None,
    )
    kvc = SimpleNamespace(
        kv_cache_dtype_str="octave_k3v4",
        use_mla_backend=False,
        is_hybrid_swa=False,
        mambaish_config=None,
        server_args=server_args,
        model_config=SimpleNamespace(head_dim=64, v_head_dim=64, model_path="m", hf_text_config=SimpleNamespace()),
    )
    for key, value in overrides.items():
        target = server_args if hasattr(server_args, key) else kvc
        setattr(target, key, value)
    return kvc


@pytest.mark.parametrize(
    "overrides, backends, message",
    [
        ({"use_mla_backend": True}, ("torch_native", "torch_native"), "multi-head / grouped-query attention models only"),
        ({"is_hybrid_swa": True}, ("triton", "triton"),
         "supports full-attention models and linear-attention hybrids .*sliding-window attention layers"),
        ({}, ("flashinfer", "flashinfer"), "backend 'flashinfer' cannot read this format; supported: triton, torch_native"),
        ({"enable_hierarchical_cache": True, "hicache_mem_layout": "page_head"}, ("triton", "triton"),
         "--hicache-mem-layout 'page_head' is not supported; use one of layer_first, page_first, page_first_direct"),
        ({"model_config": SimpleNamespace(head_dim=96, v_head_dim=96, model_path="m", hf_text_config=SimpleNamespace())},
         ("triton", "triton"), "head_dim 96 is not supported; supported head_dim: \\(64, 128, 256\\)"),
    ],
)  # fmt: skip
def test_startup_refusals_name_what_is_supported(overrides, backends, message, monkeypatch):
    monkeypatch.setattr(compat, "attention_backends", lambda: backends)
    monkeypatch.setattr(platform, "cpu_platform_active", lambda: False)  # a GPU server
    monkeypatch.setattr(compat, "get_parallel", lambda: SimpleNamespace(attn_dcp_size=1))
    with pytest.raises(ValueError, match=message):
        support.check_supported(fake_configurator(**overrides))


QSA_HYBRID = {"mambaish_config": object(), "model_config": SimpleNamespace(
    head_dim=64, v_head_dim=64, model_path="m", hf_text_config=SimpleNamespace(indexer_n_heads=4))}


@pytest.mark.parametrize("overrides", [{}, {"enable_hierarchical_cache": True}, {"mambaish_config": object()},
                                       QSA_HYBRID])  # the QSA hybrid on the CPU platform
def test_supported_setup_passes(monkeypatch, overrides):
    monkeypatch.setattr(platform, "cpu_platform_active", lambda: True)
    monkeypatch.setattr(compat, "attention_backends", lambda: ("torch_native", "torch_native"))
    monkeypatch.setattr(compat, "get_parallel", lambda: SimpleNamespace(attn_dcp_size=1))
    assert support.check_supported(fake_configurator(**overrides)).name == "octave_k3v4"


def test_qsa_hybrid_runs_on_a_gpu_in_every_format_without_prefill_context_parallelism(monkeypatch):
    monkeypatch.setattr(platform, "cpu_platform_active", lambda: False)  # a GPU server
    monkeypatch.setattr(compat, "attention_backends", lambda: ("triton", "triton"))
    parallel = SimpleNamespace(attn_dcp_size=1, enable_prefill_cp=False, attn_cp_size=1)
    monkeypatch.setattr(compat, "get_parallel", lambda: parallel)
    for name in ("int8", "octave_k3v4", "octave_k3v3"):
        assert support.check_supported(fake_configurator(kv_cache_dtype_str=name, **QSA_HYBRID)).name == name
    parallel.enable_prefill_cp, parallel.attn_cp_size = True, 2
    for name in ("int8", "octave_k3v3"):
        with pytest.raises(ValueError, match="does not support prefill context parallelism for QSA"):
            support.check_supported(fake_configurator(kv_cache_dtype_str=name, **QSA_HYBRID))
    # a format without GPU gathers is refused there, naming those that have them
    parallel.enable_prefill_cp, parallel.attn_cp_size = False, 1
    monkeypatch.setattr(support, "QSA_GPU_FORMATS", ("int8", "octave_k3v3"))
    with pytest.raises(ValueError, match="serves QSA sparse-attention hybrids \\(m\\) on the CPU platform only; on a "
                                         "GPU use --kv-cache-dtype int8 or octave_k3v3 \\(or auto\\)"):
        support.check_supported(fake_configurator(kv_cache_dtype_str="octave_k3v4", **QSA_HYBRID))


def test_unequal_k_and_v_head_sizes_are_refused():
    with pytest.raises(ValueError, match="equal K and V head sizes"):
        resolve_kv_format("int8", head_dim=128, v_head_dim=64, rotary_dim=128, model="m")
