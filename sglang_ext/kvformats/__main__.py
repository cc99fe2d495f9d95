"""python -m sglang_ext.kvformats --head-dim D [--rotary-dim R] [--json]: bytes and capacity of each format."""

from __future__ import annotations

import argparse
import json
import sys

from . import FORMAT_NAMES, get_format


def rows(head_dim: int, rotary_dim: int | None) -> list[dict]:
    base = get_format("bf16", head_dim, rotary_dim).bytes_per_token_head
    out = []
    for name in FORMAT_NAMES:
        fmt = get_format(name, head_dim, rotary_dim)
        out.append({
            "name": name,
            "head_dim": head_dim,
            "rotary_dim": fmt.rotary_dim,
            "bits": fmt.describe_bits(),
            "bits_per_element": round(fmt.bits_per_element, 4),
            "bytes_per_token_head": fmt.bytes_per_token_head,
            "capacity_vs_bf16": round(base / fmt.bytes_per_token_head, 4),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_ext.kvformats", description=__doc__)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--rotary-dim", type=int, default=None, help="RoPE dims (the first ones of a head); default: all")
    ap.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    args = ap.parse_args(argv)
    try:
        table = rows(args.head_dim, args.rotary_dim)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    print(f"head_dim {args.head_dim}, rotary_dim {table[0]['rotary_dim']} (per token, per KV head, K and V together)")
    print(f"{'format':<13} {'bits (per block)':<22} {'bits/elem':>9} {'bytes':>6} {'capacity vs bf16':>17}")
    for r in table:
        print(f"{r['name']:<13} {r['bits']:<22} {r['bits_per_element']:>9.3f} {r['bytes_per_token_head']:>6} "
              f"{r['capacity_vs_bf16']:>16.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
