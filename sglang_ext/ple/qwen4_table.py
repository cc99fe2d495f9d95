"""qwen4_exp's n-gram PLE table: its hashed row ids (plain torch; no sglang, no sympy) and its checkpoint layout.

For PLE layer `l` with n-gram size `G` and `H` heads per n-gram order, a token's window is the last `G`
tokens ending at it (`[N, G]`, oldest first, `eos` where the window runs past a sequence start). For order
g = 2..G the window's last g tokens are mixed as

    mix_g = XOR_{p < g} token[-1-p] * multiplier[p]      (int64, wrapping)

where a token beyond an `eos` that precedes the current token reads as `eos` (n-grams do not cross document
boundaries). Head h of order g has its own prime modulus `size[(g-2)*H + h]` and row offset, so

    row_id[(g-2)*H + h] = mix_g mod size[...] + offset[...]   ->   [N, (G-1)*H] ids into one table.

The multipliers come from splitmix64 seeded by (seed, layer); the moduli are consecutive primes from
`ngram_vocab_size_base`, layer after layer. This mirrors `Qwen4ExpNGramEmbedding` in SGLang 0.5.23
(`srt/models/qwen4_exp.py`); tests/ple checks it against that code on real token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import re

import torch

from sglang_ext.ple.layout import PleTableError, TableLayout, TensorEntry

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_LAYER_PRIME = 10007
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # deterministic Miller-Rabin below 3.3e24


def _splitmix64(x: int) -> int:
    x = (x + _GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return (x ^ (x >> 31)) & _MASK64


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(n: int) -> int:
    """Smallest prime strictly greater than n."""
    n += 1
    while not is_prime(n):
        n += 1
    return n


@dataclass
class Qwen4NgramHasher:
    """Row ids of one PLE layer's n-gram table. Fields mirror the model config (`text_config`)."""

    vocab_size: int
    ngram_size: int
    heads_per_ngram: int
    ngram_vocab_size_base: int
    eos_token_id: int
    ple_layer_index: int = 0
    seed: int = 1234
    make_ngram_vocab_size_divisible_by: int = 1
    layer_multipliers: torch.Tensor = field(init=False)  # [ngram_size] int64
    head_vocab_sizes: torch.Tensor = field(init=False)  # [ngram_heads] int64 (primes)
    head_offsets: torch.Tensor = field(init=False)  # [ngram_heads] int64

    def __post_init__(self) -> None:
        if self.ngram_size < 2 or self.heads_per_ngram < 1 or self.ngram_vocab_size_base < 1:
            raise ValueError(f"bad n-gram config: ngram_size={self.ngram_size} heads_per_ngram={self.heads_per_ngram} "
                             f"ngram_vocab_size_base={self.ngram_vocab_size_base}")
        half_bound = max(1, ((1 << 63) - 1) // max(self.vocab_size, 1) // 2)
        base_seed = self.seed + _LAYER_PRIME * self.ple_layer_index
        mults = [2 * (_splitmix64((base_seed + _GAMMA * (i + 1)) & _MASK64) % half_bound) + 1
                 for i in range(self.ngram_size)]
        self.layer_multipliers = torch.tensor(mults, dtype=torch.int64)
        # Head k of this layer uses the (layer * heads + k + 1)-th prime >= base: walk the primes once.
        prime = self.ngram_vocab_size_base - 1
        for _ in range(self.ple_layer_index * self.ngram_heads):
            prime = next_prime(prime)
        sizes = []
        for _ in range(self.ngram_heads):
            prime = next_prime(prime)
            sizes.append(prime)
        self.head_vocab_sizes = torch.tensor(sizes, dtype=torch.int64)
        self.head_offsets = torch.cumsum(self.head_vocab_sizes, 0) - self.head_vocab_sizes

    @property
    def ngram_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def used_rows(self) -> int:
        """Rows the hash can address (sum of the head moduli)."""
        return int(self.head_vocab_sizes.sum())

    @property
    def padded_rows(self) -> int:
        """Rows of the model's embedding: used_rows rounded up to make_ngram_vocab_size_divisible_by."""
        d = self.make_ngram_vocab_size_divisible_by
        return -(-self.used_rows // d) * d

    def windows(self, tokens: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """[T] tokens of one sequence (+ optional [ngram_size-1] earlier tokens) -> [T, ngram_size] windows."""
        pad = history if history is not None else tokens.new_full((self.ngram_size - 1,), self.eos_token_id)
        return torch.cat([pad.to(tokens.dtype), tokens]).unfold(0, self.ngram_size, 1)

    def hash_windows(self, windows: torch.Tensor) -> torch.Tensor:
        """windows: [N, ngram_size] token ids (oldest first) -> row ids [N, ngram_heads] int64."""
        w = windows.to(torch.int64)
        eos = self.eos_token_id
        last = self.ngram_size - 1
        is_eos = w == eos
        # blocked[:, p]: an eos sits strictly between token[-1-p] and the current token.
        blocked = torch.zeros_like(is_eos[:, 0])
        mix = w[:, last] * self.layer_multipliers[0]
        ids = []
        for p in range(1, self.ngram_size):
            tok = torch.where(blocked, torch.full_like(w[:, 0], eos), w[:, last - p])
            mix = torch.bitwise_xor(mix, tok * self.layer_multipliers[p])
            blocked = blocked | is_eos[:, last - p]
            heads = slice((p - 1) * self.heads_per_ngram, p * self.heads_per_ngram)
            ids.append(torch.remainder(mix.unsqueeze(1), self.head_vocab_sizes[heads]) + self.head_offsets[heads])
        return torch.cat(ids, dim=1)


_SHARD_RE = re.compile(r"\.ngram_embedding\.shard_(\d+)\.weight$")


def qwen4_table_layout(
    entries: dict[str, TensorEntry],
    module_prefix: str,
    *,
    padded_rows: int,
    split_parts: int,
    min_rows: int,
    dim: int | None = None,
    dtype: torch.dtype | None = None,
) -> TableLayout:
    """The layout of one PLE layer's table from a checkpoint's tensors (headers only).

    qwen4_exp checkpoints store the table as `{module_prefix}.ngram_embedding.shard_{i}.weight`, shard i holding
    rows from `i * ceil(padded_rows / split_parts)`. Shards must be contiguous from 0 and cover at least
    `min_rows` rows (the highest id the hash can produce + 1); a gap or a short table raises PleTableError.
    """
    prefix = f"{module_prefix}.ngram_embedding.shard_"
    shards = {}
    for name, entry in entries.items():
        if name.startswith(prefix):
            m = _SHARD_RE.search(name)
            if m and name == f"{prefix}{m.group(1)}.weight":
                shards[int(m.group(1))] = entry
    if not shards:
        raise PleTableError(f"no tensors named {prefix}<i>.weight in the checkpoint")
    shard_rows = -(-padded_rows // split_parts)
    ordered = []
    for i in range(max(shards) + 1):
        if i not in shards:
            raise PleTableError(f"PLE table {module_prefix}: shard {i} of {max(shards) + 1} is missing")
        e = shards[i]
        if i < max(shards) and e.shape[0] != shard_rows:
            raise PleTableError(f"PLE table {module_prefix}: shard {i} has {e.shape[0]} rows, expected {shard_rows} "
                                f"(= ceil({padded_rows} / split_ngram_parts {split_parts}))")
        ordered.append(e)
    layout = TableLayout.from_entries(ordered, expected_dim=dim, expected_dtype=dtype)
    if layout.num_rows < min_rows:
        raise PleTableError(f"PLE table {module_prefix}: {layout.num_rows} rows in the checkpoint, the n-gram hash "
                            f"addresses {min_rows}")
    return layout
