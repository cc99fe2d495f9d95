"""The SGLang glue without a server: the flag, the Gemma 3n table served from a real checkpoint, the qwen4
embedding's gather (bf16 and fp8 tables), and start-up errors."""

import types
from pathlib import Path

import pytest
import torch

from sglang_ext.ple import PleStoreConfig, PleTableError, PleTableStore, TableLayout, index_safetensors_dir
from sglang_ext.ple import sglang_glue
from sglang_ext.ple.table_file import write_table_tensors

from tiny_gemma3n import NUM_LAYERS, PLE_DIM, build_tiny_gemma3n, greedy_tokens_hf

TEXT = "The capital of France is Paris. The Seine flows through it, past the Louvre."


@pytest.fixture(scope="module")
def registered():
    sglang_glue.register()
    assert sglang_glue.register() == [], "register() must be idempotent"


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    from sglang_ext.models import prepare

    return Path(prepare())


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory, smollm2_dir) -> Path:
    return build_tiny_gemma3n(tmp_path_factory.mktemp("tiny_gemma3n"), smollm2_dir)


def test_flag_accepts_ssd(registered):
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "/nonexistent", "--ple-offload-backend", "ssd"])
    assert resolving_view(args).ple_offload_backend == "ssd"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gemma3n_ssd_embedding_matches_sglang_embedding(tiny_gemma, smollm2_dir, dtype):
    """SsdScaledEmbedding over the checkpoint file == SGLang's Gemma3TextScaledWordEmbedding with the table
    loaded in RAM (as SGLang's loader does: cast to the model dtype), on real token ids."""
    from safetensors import safe_open
    from sglang.srt.models.gemma3_causal import Gemma3TextScaledWordEmbedding
    from tokenizers import Tokenizer

    ids = torch.tensor(Tokenizer.from_file(str(smollm2_dir / "tokenizer.json")).encode(TEXT).ids)
    entries = {sglang_glue._rename(n): e for n, e in index_safetensors_dir(str(tiny_gemma)).items()}
    store = sglang_glue.open_gemma3n_table(entries, "model", 49152, NUM_LAYERS * PLE_DIM, "cpu")
    scale = PLE_DIM**0.5
    ssd = sglang_glue.SsdScaledEmbedding(store, scale, dtype)

    ram = Gemma3TextScaledWordEmbedding(49152, NUM_LAYERS * PLE_DIM, 2, embed_scale=scale).to(dtype)
    with safe_open(str(tiny_gemma / "model.safetensors"), "pt") as f:
        ram.weight.data.copy_(f.get_tensor("model.embed_tokens_per_layer.weight"))
    with torch.no_grad():
        want = ram(ids)
    got = ssd(ids)
    assert got.dtype == want.dtype and got.shape == want.shape == (ids.numel(), NUM_LAYERS * PLE_DIM)
    assert torch.equal(got, want), f"max abs diff {(got - want).abs().max().item()}"
    store.close()


def test_tiny_gemma3n_output_depends_on_the_ple_table(tiny_gemma, smollm2_dir):
    """Precondition of the end-to-end test: zeroing the per-layer table changes the greedy tokens (HF, fp32)."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json")).encode("The capital of France is").ids
    with_table = greedy_tokens_hf(tiny_gemma, ids, 6)
    zeroed = greedy_tokens_hf(tiny_gemma, ids, 6, zero_ple=True)
    assert with_table != zeroed, f"greedy tokens {with_table} do not depend on the per-layer embedding table"


def test_gemma3n_table_errors(tiny_gemma):
    entries = {sglang_glue._rename(n): e for n, e in index_safetensors_dir(str(tiny_gemma)).items()}
    with pytest.raises(PleTableError, match="rows of 64 elements, the model expects 80"):
        sglang_glue.open_gemma3n_table(entries, "model", 49152, 80, "cpu")
    with pytest.raises(PleTableError, match="49152 rows in 1 tensor.*expects 262144"):
        sglang_glue.open_gemma3n_table(entries, "model", 262144, 64, "cpu")
    with pytest.raises(PleTableError, match="model.language.embed_tokens_per_layer.weight not in the checkpoint"):
        sglang_glue.open_gemma3n_table(entries, "model.language", 49152, 64, "cpu")


@pytest.mark.parametrize("table_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_qwen4_ssd_embedding_gather(registered, tmp_path, table_dtype):
    """The swapped-in qwen4 embedding class builds without a table and gathers bf16 rows from the store."""
    q = pytest.importorskip("sglang.srt.models.qwen4_exp")
    ssd_cls = q.Qwen4ExpPinnedHostEmbedding
    assert ssd_cls.__name__ == "SsdNgramEmbedding", "register() did not patch qwen4_exp on import"
    rows, dim = 1000, 10
    table = torch.randn(rows, dim, generator=torch.Generator().manual_seed(5)).to(table_dtype)
    write_table_tensors(str(tmp_path / "t.safetensors"), {"t": table})
    attrs = {name: None for name in ssd_cls._COPIED_ATTRIBUTES}
    attrs.update(tp_size=1, embedding_dim=dim, org_vocab_size=rows)
    source = types.SimpleNamespace(**attrs, weight=torch.empty(rows, dim, dtype=table_dtype, device="meta"),
                                   weight_scale=torch.ones(1, dtype=torch.bfloat16))
    emb = ssd_cls(source, backend="ssd", table_dir=None)
    assert emb.weight.device.type == "meta", "the SSD backend must not allocate the table"
    ids = torch.randint(0, rows, (7, 16), generator=torch.Generator().manual_seed(6))
    with pytest.raises(RuntimeError, match="before load_weights"):
        emb.gather(ids)
    emb._ssd_store = PleTableStore(TableLayout.from_safetensors(str(tmp_path / "t.safetensors"), "t"),
                                   PleStoreConfig(threads=2))
    emb._ssd_pending = False
    want = table[ids].to(torch.bfloat16)
    got = emb.gather(ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    out = torch.zeros_like(want)
    assert emb.gather(ids, out=out) is out and torch.equal(out, want)
    emb._ssd_store.close()


def test_qwen4_ssd_embedding_tp_ranks_read_their_shard(registered, tmp_path):
    """Under tensor parallelism each rank returns the rows of its vocabulary shard and zeros elsewhere, as SGLang's
    gather kernel does, so that the layer's all-reduce (here: the sum over ranks) gives table[ids] exactly; each
    rank's store reads only the ids of its own shard."""
    q = pytest.importorskip("sglang.srt.models.qwen4_exp")
    ssd_cls = q.Qwen4ExpPinnedHostEmbedding
    rows, dim, tp = 1000, 10, 2
    table = torch.randn(rows, dim, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    write_table_tensors(str(tmp_path / "t.safetensors"), {"t": table})
    ids = torch.randint(0, rows, (5, 12), generator=torch.Generator().manual_seed(8))
    total = torch.zeros(*ids.shape, dim, dtype=torch.bfloat16)
    per_rank = -(-rows // tp)
    for rank in range(tp):
        start, end = rank * per_rank, min(rows, (rank + 1) * per_rank)
        attrs = {name: None for name in ssd_cls._COPIED_ATTRIBUTES}
        attrs.update(tp_size=tp, embedding_dim=dim, org_vocab_size=rows,
                     shard_indices=types.SimpleNamespace(org_vocab_start_index=start, org_vocab_end_index=end))
        source = types.SimpleNamespace(**attrs, weight=torch.empty(per_rank, dim, dtype=torch.bfloat16, device="meta"),
                                       weight_scale=torch.ones(1, dtype=torch.bfloat16))
        emb = ssd_cls(source, backend="ssd", table_dir=None)
        emb._ssd_store = PleTableStore(TableLayout.from_safetensors(str(tmp_path / "t.safetensors"), "t"),
                                       PleStoreConfig(threads=2))
        emb._ssd_pending = False
        got = emb.gather(ids)
        mine = (ids >= start) & (ids < end)
        assert torch.equal(got[mine], table[ids[mine]]), f"rank {rank}: rows of its shard differ"
        assert not got[~mine].any(), f"rank {rank}: rows outside its shard must be zero"
        assert emb._ssd_store.rows_requested == int(mine.sum()), f"rank {rank} read rows of another shard"
        total += got
        emb._ssd_store.close()
    assert torch.equal(total, table[ids])
