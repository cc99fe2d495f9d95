"""SSD-resident PLE / n-gram embedding tables (core: never imports sglang).

`PleTableStore` gathers rows of a table that stays in the checkpoint's safetensors files; `layout` finds the
rows from the headers; `qwen4_hash` reproduces qwen4_exp's n-gram row ids. SGLang glue: `sglang_glue.py`.
"""

from sglang_ext.ple.layout import PleTableError, TableLayout, index_safetensors_dir, read_safetensors_header
from sglang_ext.ple.store import PleStoreConfig, PleTableStore

__all__ = [
    "PleStoreConfig",
    "PleTableError",
    "PleTableStore",
    "TableLayout",
    "index_safetensors_dir",
    "read_safetensors_header",
]
