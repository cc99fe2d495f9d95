"""Merge a later, partial kernels_bench.py run into an earlier full one:

    python3 benchmarks/kernels_merge.py earlier.json later.json merged.json [--label-earlier A --label-later B]

Every decode shape (head_dim, batch, context) the later run measured replaces all of the earlier run's rows
of that shape (every kernel, SGLang's included, so a speed-up is always within one run); the later run's
extend rows replace the earlier's of the same head_dim; checks of both runs are kept. Each decode / extend row is tagged with its
run, and the targets are recomputed from the merged rows. Copy bandwidth: the earlier run's (both recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels_report import targets  # noqa: E402


def merge(early: dict, late: dict, label_early: str, label_late: str) -> dict:
    shapes = {(r["head_dim"], r["batch"], r["ctx"]) for r in late["decode"]}
    out = dict(early)
    out["decode"] = [{**r, "run": label_early} for r in early["decode"]
                     if (r["head_dim"], r["batch"], r["ctx"]) not in shapes]
    out["decode"] += [{**r, "run": label_late} for r in late["decode"]]
    out["decode"].sort(key=lambda r: (r["head_dim"], r["batch"], r["ctx"]))
    ext_dims = {r["head_dim"] for r in late["extend"]}
    out["extend"] = [{**r, "run": label_early} for r in early["extend"] if r["head_dim"] not in ext_dims] + \
        [{**r, "run": label_late} for r in late["extend"]]
    out["checks"] = [{**c, "run": label_early} for c in early["checks"]] + \
        [{**c, "run": label_late} for c in late["checks"]]
    out["copy_by_run"] = {label_early: early["copy"], label_late: late["copy"]}
    out["merged_from"] = [label_early, label_late]
    out["targets"] = targets(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("earlier")
    ap.add_argument("later")
    ap.add_argument("out")
    ap.add_argument("--label-earlier", default="earlier")
    ap.add_argument("--label-later", default="later")
    a = ap.parse_args()
    merged = merge(json.loads(Path(a.earlier).read_text()), json.loads(Path(a.later).read_text()),
                   a.label_earlier, a.label_later)
    Path(a.out).write_text(json.dumps(merged, indent=1))


if __name__ == "__main__":
    main()
