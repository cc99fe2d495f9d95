"""Run `python -m sglang_ext.ple bench` over readers and thread counts; print a markdown table for
docs/benchmarks/ple.md. Each configuration runs in its own process, so each peak RSS is that run's own.

Produces docs/benchmarks/ple.md, "Results: 4 GiB table". Time: not recorded; each configuration is a
process that writes the table and gathers cold and warm.

    python benchmarks/ple_sweep.py --table-gb 4 --budget-mb 64 --threads 1 4 8 16 32 --readers pread mmap
"""

import argparse
import os
import re
import subprocess
import sys

ROW = re.compile(r"^\s*(decode|prefill)\s+(cold|warm)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)$")
RSS = re.compile(r"RSS before store (\d+) MiB, peak (\d+) MiB \(\+(\d+) MiB")


def run(args, reader: str, threads: int) -> dict:
    cmd = [sys.executable, "-m", "sglang_ext.ple", "bench", "--table-gb", str(args.table_gb), "--budget-mb",
           str(args.budget_mb), "--threads", str(threads), "--reader", reader, "--decode-steps",
           str(args.decode_steps), "--prefill-steps", str(args.prefill_steps)]
    if args.path:
        cmd += ["--path", args.path]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    res = {}
    for line in proc.stdout.splitlines():
        if m := ROW.match(line):
            res[(m[1], m[2])] = (float(m[5]), float(m[6]))
        elif m := RSS.search(line):
            res["rss_growth"] = int(m[3])
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--table-gb", type=float, default=4)
    p.add_argument("--budget-mb", type=int, default=64)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    p.add_argument("--readers", nargs="+", default=["pread", "mmap"])
    p.add_argument("--decode-steps", type=int, default=100)
    p.add_argument("--prefill-steps", type=int, default=4)
    p.add_argument("--path", default=None)
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}")
    print("| reader | threads | decode cold p50/p99 ms | decode warm p50/p99 ms | prefill cold p50 ms "
          "| prefill warm p50/p99 ms | peak RSS growth MiB | load (1 min, before-after) |")
    print("|---|---|---|---|---|---|---|---|")
    for reader in args.readers:
        for t in args.threads:
            load0 = os.getloadavg()[0]
            r = run(args, reader, t)
            dc, dw, pc, pw = (r[("decode", "cold")], r[("decode", "warm")], r[("prefill", "cold")],
                              r[("prefill", "warm")])
            print(f"| {reader} | {t} | {dc[0]:.1f} / {dc[1]:.1f} | {dw[0]:.2f} / {dw[1]:.2f} | {pc[0]:.0f} "
                  f"| {pw[0]:.0f} / {pw[1]:.0f} | {r['rss_growth']} | {load0:.1f}-{os.getloadavg()[0]:.1f} |",
                  flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
