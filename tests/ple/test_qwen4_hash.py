"""qwen4_exp's hashed n-gram gather through the SSD store matches SGLang's own hash + in-RAM lookup.

Token ids come from a real sentence and the SmolLM2 tokenizer. SGLang's side is the model's own code
(`Qwen4ExpNGramEmbedding._build_*` and `_hash_contexts` from sglang 0.5.23) run on a module built without its
distributed embedding, then `table[ids]`, which is what the unquantized single-rank embedding computes.
"""

import json
import types
from pathlib import Path

import pytest
import torch

from sglang_ext.ple import PleStoreConfig, PleTableError, PleTableStore, index_safetensors_dir
from sglang_ext.ple.qwen4_table import Qwen4NgramHasher, next_prime, qwen4_table_layout
from sglang_ext.ple.table_file import write_table_tensors

TEXT = ("The quick brown fox jumps over the lazy dog near the river bank. "
        "Paris is the capital of France, and the Seine flows through it.")
CFG = dict(vocab_size=49152, ngram_size=3, heads_per_ngram=8, ngram_vocab_size_base=2003, eos_token_id=2,
           ple_layer_index=1, seed=1234, make_ngram_vocab_size_divisible_by=128)
HEAD_DIM = 10  # ple_embed_dim 160 / 16 heads
SPLIT_PARTS = 7
PREFIX = "model.layers.5.ple.ple_embedding"


def smollm2_token_ids() -> list[int]:
    from sglang_ext.models.builtin import default_model_dir, find_gguf

    tok_json = Path(default_model_dir()) / "tokenizer.json"
    if tok_json.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(tok_json)).encode(TEXT).ids
    from transformers import AutoTokenizer

    gguf = find_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)(TEXT)["input_ids"]


@pytest.fixture(scope="module")
def sglang_ngram():
    """SGLang's Qwen4ExpNGramEmbedding with the attributes its hash uses, and its forward-context pool."""
    q = pytest.importorskip("sglang.srt.models.qwen4_exp")
    cls = q.Qwen4ExpNGramEmbedding
    mod = cls.__new__(cls)
    torch.nn.Module.__init__(mod)
    mod.config = types.SimpleNamespace(seed=CFG["seed"])
    mod.unigram_vocab_size = CFG["vocab_size"]
    mod.ple_layer_index = CFG["ple_layer_index"]
    mod.ngram_size = CFG["ngram_size"]
    mod.heads_per_ngram = CFG["heads_per_ngram"]
    mod.ngram_heads = (CFG["ngram_size"] - 1) * CFG["heads_per_ngram"]
    mod.ngram_vocab_size_base = CFG["ngram_vocab_size_base"]
    mod.eos_token_id = CFG["eos_token_id"]
    mod.enable_ple_fusion = False
    mod.layer_multipliers = mod._build_layer_multipliers(mod.ngram_size)
    sizes, offsets, total = mod._build_head_vocab_and_offsets()
    mod.ngram_heads_vocab_sizes = torch.tensor(sizes, dtype=torch.long)
    mod.ngram_heads_offsets = torch.tensor(offsets, dtype=torch.long)
    pool = types.SimpleNamespace(ple_window_cache=None)
    return q, mod, pool, total


def test_hasher_constants_match_sglang(sglang_ngram):
    _, mod, _, total = sglang_ngram
    h = Qwen4NgramHasher(**CFG)
    assert torch.equal(h.layer_multipliers, mod.layer_multipliers), (h.layer_multipliers, mod.layer_multipliers)
    assert torch.equal(h.head_vocab_sizes, mod.ngram_heads_vocab_sizes)
    assert torch.equal(h.head_offsets, mod.ngram_heads_offsets)
    assert h.used_rows == total
    assert next_prime(2003) == 2011 and next_prime(1) == 2 and next_prime(7919) == 7927


def test_hashed_gather_matches_sglang_in_ram_lookup(sglang_ngram, tmp_path, monkeypatch):
    q, mod, pool, _ = sglang_ngram
    monkeypatch.setattr(q, "get_req_to_token_pool", lambda: pool)
    h = Qwen4NgramHasher(**CFG)
    # Two documents separated by eos: n-grams must not cross the boundary.
    ids = smollm2_token_ids()
    assert len(ids) > 20 and CFG["eos_token_id"] not in ids
    tokens = torch.tensor(ids[:15] + [CFG["eos_token_id"]] + ids[15:], dtype=torch.long)
    windows = h.windows(tokens)  # [T, ngram_size]

    sglang_ids = mod._hash_contexts(windows)  # [T, 16]
    ours = h.hash_windows(windows)
    assert torch.equal(ours, sglang_ids), f"{int((ours != sglang_ids).sum())} of {ours.numel()} ids differ"

    # The table as a qwen4 checkpoint stores it: split_ngram_parts shards, over two files, next to other weights.
    g = torch.Generator().manual_seed(3)
    table = torch.randn(h.padded_rows, HEAD_DIM, generator=g).to(torch.bfloat16)
    shard_rows = -(-h.padded_rows // SPLIT_PARTS)
    shards = {f"{PREFIX}.ngram_embedding.shard_{i}.weight": table[i * shard_rows : (i + 1) * shard_rows]
              for i in range(SPLIT_PARTS)}
    names = list(shards)
    write_table_tensors(str(tmp_path / "model-00001-of-00002.safetensors"),
                        {"model.embed_tokens.weight": torch.randn(8, 4), **{n: shards[n] for n in names[:3]}})
    write_table_tensors(str(tmp_path / "model-00002-of-00002.safetensors"), {n: shards[n] for n in names[3:]})
    weight_map = {n: "model-00001-of-00002.safetensors" for n in ["model.embed_tokens.weight", *names[:3]]}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in names[3:]})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    layout = qwen4_table_layout(index_safetensors_dir(str(tmp_path)), PREFIX, padded_rows=h.padded_rows,
                                split_parts=SPLIT_PARTS, min_rows=h.used_rows, dim=HEAD_DIM, dtype=torch.bfloat16)
    want = table[sglang_ids]  # SGLang's in-RAM lookup: [T, 16, HEAD_DIM]
    with PleTableStore(layout, PleStoreConfig(threads=2, cache_bytes=4096)) as store:
        out = torch.zeros_like(want)
        assert not torch.equal(out.view(torch.uint8), want.view(torch.uint8))
        got = store.gather(ours, out=out)
    diff = (got.view(torch.uint8) != want.view(torch.uint8)).reshape(-1, HEAD_DIM * 2).any(dim=1)
    assert not diff.any(), f"{int(diff.sum())} of {diff.numel()} gathered rows differ from SGLang's lookup"


def test_qwen4_layout_errors(tmp_path):
    h = Qwen4NgramHasher(**CFG)
    shard_rows = -(-h.padded_rows // SPLIT_PARTS)
    t = torch.zeros(shard_rows, HEAD_DIM, dtype=torch.bfloat16)
    write_table_tensors(str(tmp_path / "m.safetensors"), {f"{PREFIX}.ngram_embedding.shard_{i}.weight": t
                                                          for i in (0, 1, 3)})
    entries = index_safetensors_dir(str(tmp_path))
    kw = dict(padded_rows=h.padded_rows, split_parts=SPLIT_PARTS, min_rows=h.used_rows)
    with pytest.raises(PleTableError, match="shard 2 of 4 is missing"):
        qwen4_table_layout(entries, PREFIX, **kw)
    with pytest.raises(PleTableError, match="no tensors named"):
        qwen4_table_layout(entries, "model.layers.9.ple.ple_embedding", **kw)
    only_two = {k: v for k, v in entries.items() if not k.endswith("shard_3.weight")}
    with pytest.raises(PleTableError, match=f"{2 * shard_rows} rows in the checkpoint, the n-gram hash addresses"):
        qwen4_table_layout(only_two, PREFIX, **kw)
    with pytest.raises(PleTableError, match="the model expects 16"):
        qwen4_table_layout(only_two, PREFIX, **{**kw, "min_rows": 1}, dim=16)
