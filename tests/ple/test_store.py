"""The SSD PLE store: bit-exact gathers against the same table held in RAM, and clear errors on bad input."""

import json
import os

import numpy as np
import pytest
import torch

from sglang_ext.ple import PleStoreConfig, PleTableError, PleTableStore, TableLayout, index_safetensors_dir
from sglang_ext.ple.layout import read_safetensors_header
from sglang_ext.ple.table_file import write_table_tensors

DIM = 80  # bf16 -> 160-byte rows
SEG_ROWS = (1000, 777, 1200)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A 2977-row table split over three tensors in two files, plus the same table in RAM."""
    d = tmp_path_factory.mktemp("ple_table")
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, DIM, generator=g).to(torch.bfloat16) for n in SEG_ROWS]
    # Raw random bit patterns too (NaNs, denormals): the store must copy bytes, not values.
    parts[1][::7] = torch.randint(0, 1 << 16, (len(range(0, SEG_ROWS[1], 7)), DIM), generator=g,
                                  dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    other = torch.randn(3, 5, generator=g)
    write_table_tensors(str(d / "a.safetensors"), {"other": other, "t.0": parts[0], "t.1": parts[1]})
    write_table_tensors(str(d / "b.safetensors"), {"t.2": parts[2]})
    entries = index_safetensors_dir(str(d))
    layout = TableLayout.from_entries([entries[f"t.{i}"] for i in range(3)], expected_rows=sum(SEG_ROWS),
                                      expected_dim=DIM, expected_dtype=torch.bfloat16)
    return d, layout, torch.cat(parts)


def make_ids(kind: str, n: int, num_rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randint(0, num_rows, (n // 16, 16), generator=g)
    if kind == "repeated":  # few distinct rows, each many times, plus segment boundaries
        pool = torch.tensor([0, 999, 1000, 1776, 1777, num_rows - 1, 5])
        return pool[torch.randint(0, pool.numel(), (n,), generator=g)]
    if kind == "sorted":  # ascending runs of consecutive rows (coalesced reads) across segments
        return torch.arange(900, 900 + n) % num_rows
    raise ValueError(kind)


def assert_gather_exact(store: PleTableStore, ram: torch.Tensor, ids: torch.Tensor) -> None:
    want = ram[ids]
    out = torch.zeros((*ids.shape, DIM), dtype=torch.bfloat16)
    assert not torch.equal(out.view(torch.uint8), want.view(torch.uint8)), "destination already equals the source"
    got = store.gather(ids, out=out)
    assert got.data_ptr() == out.data_ptr()
    diff = (got.view(torch.uint8) != want.view(torch.uint8)).reshape(ids.numel(), -1).any(dim=1)
    assert not diff.any(), f"{int(diff.sum())} of {ids.numel()} rows differ from the in-RAM table"


@pytest.mark.parametrize("reader", ["pread", "mmap"])
@pytest.mark.parametrize("kind", ["random", "repeated", "sorted"])
@pytest.mark.parametrize("threads,cache_bytes,staging_rows", [(1, 0, 4096), (4, 0, 4096), (4, 64 << 10, 4096),
                                                              (3, 16 << 10, 97)])
def test_gather_bit_identical(table, reader, kind, threads, cache_bytes, staging_rows):
    _, layout, ram = table
    cfg = PleStoreConfig(reader=reader, threads=threads, cache_bytes=cache_bytes, staging_rows=staging_rows,
                         mmap_rss_bytes=256 << 10)
    with PleTableStore(layout, cfg) as store:
        for step in range(3):  # repeated gathers exercise the hot cache's hit path
            assert_gather_exact(store, ram, make_ids(kind, 2048, layout.num_rows, seed=step))
        if cache_bytes and kind == "repeated":
            assert store.cache_hit_rate > 0.5, f"hot cache hit rate {store.cache_hit_rate:.3f} on 7 repeated rows"


def test_gather_returns_new_tensor_and_empty(table):
    _, layout, ram = table
    with PleTableStore(layout, PleStoreConfig(threads=2)) as store:
        ids = torch.tensor([[5, 2976], [1000, 5]], dtype=torch.int32)
        got = store.gather(ids)
        assert got.shape == (2, 2, DIM) and got.dtype == torch.bfloat16
        assert torch.equal(got.view(torch.uint8), ram[ids.long()].view(torch.uint8))
        assert store.gather(torch.empty(0, dtype=torch.int64)).shape == (0, DIM)


def test_ids_out_of_range(table):
    _, layout, _ = table
    with PleTableStore(layout) as store:
        with pytest.raises(IndexError, match=r"\[0, 2977\], the table has 2977 rows"):
            store.gather(torch.tensor([0, 2977]))
        with pytest.raises(IndexError, match=r"\[-1, 3\]"):
            store.gather(torch.tensor([-1, 3]))
        with pytest.raises(ValueError, match="out is"):
            store.gather(torch.tensor([1]), out=torch.empty(1, DIM, dtype=torch.float32))


def test_shape_and_dtype_mismatch(table):
    d, _, _ = table
    entries = index_safetensors_dir(str(d))
    parts = [entries[f"t.{i}"] for i in range(3)]
    with pytest.raises(PleTableError, match="rows of 80 elements, the model expects 96"):
        TableLayout.from_entries(parts, expected_dim=96)
    with pytest.raises(PleTableError, match="torch.bfloat16 in the checkpoint, the model expects torch.float8_e4m3fn"):
        TableLayout.from_entries(parts, expected_dtype=torch.float8_e4m3fn)
    with pytest.raises(PleTableError, match="2977 rows in 3 tensor"):
        TableLayout.from_entries(parts, expected_rows=3000)
    with pytest.raises(PleTableError, match=r"tensor other is \[3, 5\] torch.float32; the table.s first tensor"):
        TableLayout.from_entries([entries["t.0"], entries["other"]])
    with pytest.raises(PleTableError, match="not found"):
        TableLayout.from_safetensors(str(d / "b.safetensors"), "t.9")


def test_missing_and_truncated_shard(table, tmp_path):
    d, _, _ = table
    with pytest.raises(PleTableError, match="shard is missing"):
        read_safetensors_header(str(tmp_path / "nope.safetensors"))
    # An index naming a shard that is not on disk.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.link(d / "a.safetensors", ckpt / "a.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"t.0": "a.safetensors", "t.2": "b.safetensors"}}))
    with pytest.raises(PleTableError, match=r"missing: .*b\.safetensors"):
        index_safetensors_dir(str(ckpt))
    # A shard cut short by 100 bytes.
    data = (d / "b.safetensors").read_bytes()
    short = tmp_path / "short.safetensors"
    short.write_bytes(data[:-100])
    want = f"truncated: its header needs {len(data)} bytes, the file has {len(data) - 100}"
    with pytest.raises(PleTableError, match=want):
        read_safetensors_header(str(short))
    short.write_bytes(data[:5])
    with pytest.raises(PleTableError, match="too short"):
        read_safetensors_header(str(short))
    short.write_bytes(b"\xff" * 64)
    with pytest.raises(PleTableError, match="does not fit"):
        read_safetensors_header(str(short))


def test_config_validation():
    with pytest.raises(ValueError, match=r"choose from \('pread', 'mmap'\)"):
        PleStoreConfig(reader="io_uring")
    with pytest.raises(ValueError, match="threads"):
        PleStoreConfig(threads=0)
    with pytest.raises(ValueError, match="device"):
        PleStoreConfig(device="meta")


def test_reader_coalesces_runs(table):
    """Sorted consecutive ids inside one tensor are read with one preadv per run, not one per row."""
    _, layout, ram = table
    with PleTableStore(layout, PleStoreConfig(threads=1)) as store:
        ids = torch.arange(10, 510)
        store.gather(ids)  # warm the page cache
        before = store._reader.blocking_runs
        assert_gather_exact(store, ram, ids)
        assert store.rows_read == 1000 and np.isclose(store.rows_read / store.rows_requested, 1.0)
        assert store._reader.blocking_runs - before == 0, "warm rows should be served by the RWF_NOWAIT pass"
