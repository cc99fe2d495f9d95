"""Agent-session replay: TTFT of a turn whose history is cold, warm on device, on the HiCache host tier, or in
the storage tier after a restart, per context size and per --kv-cache-dtype.

Produces docs/benchmarks/agent-sessions.md, "Current run" (TTFT per format and context). Time: about 3-4 minutes
per format on 2 CPU cores at contexts up to 6.6k tokens (one server each).

    python benchmarks/agent_sessions.py --kv-cache-dtypes bf16,int8 --contexts 512,1024,2048,4096 \
        --out docs/benchmarks/agent-sessions.md

For each KV format one server (float32 weights, HiCache host tier --hicache-ratio x the device pool (default 4: the
host holds every history plus the flood), `--hicache-storage-backend file` in a fresh folder) replays, for each of --sessions sessions and each context size C, an agent
conversation whose system prompt + tool docs + history is about C tokens:
  cold     turn 1: nothing cached;
  warm     turn 2 (= turn 1 + its answer + a new message): the history is on device;
  host     one-off traffic larger than the device pool pushes every history to the host tier, then turn 3;
  storage  once the storage folder stops growing, the server is restarted on it (device and host empty), then
           turn 4 (prefetch policy wait_complete: the whole stored history is loaded before the prefill).
TTFT is the client wall time of a non-streaming chat request with max_tokens=1 (prefill + one token). Before
each turn after the first the client waits --think-seconds (an agent reads the answer or runs a tool between turns;
the server's background write-through to host and storage of the previous turn then does not land in the TTFT). The
cached tokens per tier come from the server (`sglext.cached_tokens_details`). A format the server refuses
is skipped with its error line. Host bytes per cached token come from the host pool's own start-up line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from server import ServerProcess  # noqa: E402  (tests/server.py: a real launch_server subprocess)
from text_fixtures import long_text  # noqa: E402

from sglang_ext.models import prepare  # noqa: E402

HOST_POOL_LINE = re.compile(r"Allocating (\S+) hierarchical KV host pool: (\d+) tokens, ([\d.]+) GB host memory")
KV_DTYPE_FLAG = {"bf16": "bf16"}  # our names -> --kv-cache-dtype values (others pass through)
CONDITIONS = ("cold", "warm", "host", "storage")


def server_args(kv_dtype: str, device_tokens: int, hicache_ratio: float = 4) -> list[str]:
    return ["--dtype", "float32", "--kv-cache-dtype", KV_DTYPE_FLAG.get(kv_dtype, kv_dtype), "--enable-cache-report",
            "--max-total-tokens", str(device_tokens), "--enable-hierarchical-cache", "--hicache-ratio", f"{hicache_ratio:g}",
            "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
            "--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "wait_complete"]


def history(session: int, context_tokens: int) -> list[dict]:
    """System prompt + tool docs + earlier turns, about `context_tokens` tokens (1.3 tokens per word here)."""
    words = int(context_tokens / 1.3)
    system = f"Agent {session}, context {context_tokens}. Tools: read_file, write_file, run_tests. Project notes: "
    return [{"role": "system", "content": system + long_text(words // 2)},
            {"role": "user", "content": f"Session {session}: summarise the notes."},
            {"role": "assistant", "content": "Summary of the notes, chapter by chapter. " + long_text(words // 2)}]


def chat_turn(url: str, messages: list[dict]) -> dict:
    body = {"model": "default", "messages": messages, "max_tokens": 1, "temperature": 0,
            "return_cached_tokens_details": True}
    t0 = time.perf_counter()
    r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
    ttft = time.perf_counter() - t0
    r.raise_for_status()
    out = r.json()
    details = (out.get("sglext") or {}).get("cached_tokens_details") or {}
    return {"ttft_s": ttft, "prompt_tokens": out["usage"]["prompt_tokens"],
            "cached_tokens": (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "details": details, "answer": out["choices"][0]["message"]["content"], "load1": os.getloadavg()[0]}


def flood(server: ServerProcess, tokens: int) -> None:
    """One-off prompts (distinct first words) worth more than `tokens`: pushes everything else off device."""
    done, i = 0, 0
    while done <= tokens:
        i += 1
        out = server.generate(f"Flood {i} " * 3 + long_text(300)[::-1], max_new_tokens=1)
        done += out["meta_info"]["prompt_tokens"]


def wait_storage_settled(storage_dir: str, quiet_s: float = 3.0, limit_s: float = 120.0) -> float:
    """Wait until the storage folder stops growing for quiet_s (the server writes pages in the background;
    a restart before that loses the pages not yet written). Returns the seconds waited."""
    def size() -> int:
        return sum(f.stat().st_size for f in Path(storage_dir).rglob("*") if f.is_file())
    t0 = last_change = time.monotonic()
    last = size()
    while time.monotonic() - last_change < quiet_s and time.monotonic() - t0 < limit_s:
        time.sleep(0.5)
        now = size()
        if now != last:
            last, last_change = now, time.monotonic()
    return time.monotonic() - t0


def start(model: str, args: list[str], storage_dir: str, name: str) -> ServerProcess:
    env = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": storage_dir}
    return ServerProcess(model, args, env=env, name=name).start(attempts=2)


def run_format(model: str, kv_dtype: str, contexts: list[int], sessions: int, hicache_ratio: float,
               think_s: float = 2.0) -> dict:
    device_tokens = max(contexts) + 1024
    storage_dir = tempfile.mkdtemp(prefix=f"agent-sessions-{kv_dtype}-")
    args = server_args(kv_dtype, device_tokens, hicache_ratio)
    try:
        server = start(model, args, storage_dir, f"agent-{kv_dtype}")
    except RuntimeError as exc:
        errors = [line for line in str(exc).splitlines() if "rror" in line]
        return {"skipped": errors[-1] if errors else str(exc).splitlines()[0]}
    rows, conv = [], {}
    try:
        m = HOST_POOL_LINE.search(server.log_text())
        host = {"tokens": int(m.group(2)), "gb": float(m.group(3))} if m else None
        for s in range(sessions):
            for c in contexts:
                msgs = history(s, c) + [{"role": "user", "content": "Turn 1: what should I do first?"}]
                cold = chat_turn(server.url, msgs)
                msgs += [{"role": "assistant", "content": cold["answer"]},
                         {"role": "user", "content": "Turn 2: and then?"}]
                time.sleep(think_s)
                warm = chat_turn(server.url, msgs)
                conv[(s, c)] = (msgs, {"cold": cold, "warm": warm})
        flood(server, device_tokens)
        for (s, c), (msgs, res) in conv.items():
            msgs += [{"role": "assistant", "content": res["warm"]["answer"]},
                     {"role": "user", "content": "Turn 3: after a pause, continue."}]
            time.sleep(think_s)
            res["host"] = chat_turn(server.url, msgs)
        wait_storage_settled(storage_dir)
    finally:
        server.stop()
    server = start(model, args, storage_dir, f"agent-{kv_dtype}-restart")
    try:
        for (s, c), (msgs, res) in conv.items():
            msgs += [{"role": "assistant", "content": res["host"]["answer"]},
                     {"role": "user", "content": "Turn 4: after a restart, continue."}]
            time.sleep(think_s)
            try:
                res["storage"] = chat_turn(server.url, msgs)
            except requests.RequestException as exc:  # reported in the table, not hidden
                res["storage"] = {"ttft_s": float("nan"), "cached_tokens": 0, "details": {"error": str(exc)[:200]},
                                  "load1": os.getloadavg()[0]}
            rows.append({"session": s, "context": c, **{k: res[k] for k in CONDITIONS}})
    finally:
        server.stop()
    return {"rows": rows, "host_pool": host, "device_tokens": device_tokens}


def median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def summarize(result: dict, contexts: list[int]) -> list[dict]:
    out = []
    for c in contexts:
        rows = [r for r in result["rows"] if r["context"] == c]
        entry = {"context": c, "prompt_tokens": rows[0]["cold"]["prompt_tokens"]}
        for cond in CONDITIONS:
            entry[cond] = median([r[cond]["ttft_s"] for r in rows])
            entry[f"{cond}_cached"] = rows[0][cond]["cached_tokens"]
            entry[f"{cond}_details"] = rows[0][cond]["details"]
        out.append(entry)
    return out


def svg_plot(series: dict[str, list[dict]], path: Path) -> None:
    """Grouped bars, log-scale TTFT per context size and condition (no plotting library needed)."""
    import math

    colors = {"cold": "#c0392b", "warm": "#27ae60", "host": "#2980b9", "storage": "#8e44ad"}
    groups = [(fmt, e) for fmt, entries in series.items() for e in entries]
    w, h, left, bottom, top = 120 * len(groups) + 120, 360, 60, 60, 30
    lo, hi = -2, 2  # 10 ms .. 100 s
    def y(v):
        return top + (h - top - bottom) * (1 - (math.log10(max(v, 10 ** lo)) - lo) / (hi - lo))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="18" font-size="13">TTFT per turn (log scale), SmolLM2-135M on the CPU platform</text>']
    for k in range(lo, hi + 1):
        parts.append(f'<line x1="{left}" x2="{w - 10}" y1="{y(10 ** k):.1f}" y2="{y(10 ** k):.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y(10 ** k) + 4:.1f}" text-anchor="end">{10 ** k:g} s</text>')
    for gi, (fmt, e) in enumerate(groups):
        x0 = left + 10 + gi * 120
        for ci, cond in enumerate(CONDITIONS):
            v = e[cond]
            parts.append(f'<rect x="{x0 + ci * 24}" y="{y(v):.1f}" width="20" height="{h - bottom - y(v):.1f}" '
                         f'fill="{colors[cond]}"><title>{fmt} {e["context"]} {cond}: {v:.3f} s</title></rect>')
        parts.append(f'<text x="{x0 + 48}" y="{h - bottom + 16}" text-anchor="middle">{e["prompt_tokens"]} tok</text>'
                     f'<text x="{x0 + 48}" y="{h - bottom + 30}" text-anchor="middle">{fmt}</text>')
    for ci, cond in enumerate(CONDITIONS):
        parts.append(f'<rect x="{left + ci * 90}" y="{h - 18}" width="10" height="10" fill="{colors[cond]}"/>'
                     f'<text x="{left + ci * 90 + 14}" y="{h - 9}">{cond}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-cache-dtypes", default="bf16", help="comma-separated: bf16,int8,octave_k3v4,...")
    ap.add_argument("--contexts", default="512,1024,2048,4096", help="comma-separated context sizes (tokens)")
    ap.add_argument("--sessions", type=int, default=1, help="sessions per context size (TTFT is their median)")
    ap.add_argument("--hicache-ratio", type=float, default=4, help="host tier size / device pool size")
    ap.add_argument("--think-seconds", type=float, default=2.0, help="client pause before each later turn")
    ap.add_argument("--json", type=Path, help="also write the raw measurements here")
    ap.add_argument("--out", type=Path, help="write the markdown table here (and a .svg plot next to it)")
    a = ap.parse_args()
    contexts = sorted(int(c) for c in a.contexts.split(","))
    model = str(prepare())
    results, series = {}, {}
    for fmt in [f.strip() for f in a.kv_cache_dtypes.split(",") if f.strip()]:
        t0 = time.monotonic()
        res = run_format(model, fmt, contexts, a.sessions, a.hicache_ratio, a.think_seconds)
        res["wall_s"] = time.monotonic() - t0
        results[fmt] = res
        if "skipped" in res:
            print(f"{fmt}: skipped, the server refused it: {res['skipped']}", flush=True)
            continue
        series[fmt] = summarize(res, contexts)
        for e in series[fmt]:
            print(f"{fmt} {e['prompt_tokens']:>5} tok: " + "  ".join(
                f"{c} {e[c]:.3f}s ({e[c + '_cached']} cached)" for c in CONDITIONS), flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=str))
    if a.out and series:
        svg = a.out.with_suffix(".svg")
        svg_plot(series, svg)
        a.out.write_text(markdown(results, series, svg.name))
    return 0


def tier(details: dict, name: str) -> str:
    """Tokens the server reports from one tier (`cached_tokens_details`), or '?' when it did not report."""
    return str(details[name]) if isinstance(details, dict) and name in details else "?"


def markdown(results: dict, series: dict, svg_name: str) -> str:
    lines = ["| KV format | prompt tokens | cold TTFT | warm (device) | from host | from storage | "
             "warm / cold | host / cold | storage / cold | cached: warm / host / storage | "
             "of which from host tier / from storage tier |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for fmt, entries in series.items():
        for e in entries:
            lines.append(
                f"| {fmt} | {e['prompt_tokens']} | {e['cold']:.3f} s | {e['warm']:.3f} s | {e['host']:.3f} s | "
                f"{e['storage']:.3f} s | {100 * e['warm'] / e['cold']:.1f} % | {100 * e['host'] / e['cold']:.1f} % | "
                f"{100 * e['storage'] / e['cold']:.1f} % | {e['warm_cached']} / {e['host_cached']} / "
                f"{e['storage_cached']} | {tier(e['host_details'], 'host')} / {tier(e['storage_details'], 'storage')} |")
    for fmt, res in results.items():
        if "skipped" in res:
            lines.append(f"| {fmt} | skipped: {res['skipped']} | | | | | | | | | |")
    host_lines = []
    for fmt, res in results.items():
        hp = res.get("host_pool")
        if hp:
            host_lines.append(f"- {fmt}: host pool {hp['tokens']} tokens in {hp['gb']:.2f} GB -> "
                              f"{hp['gb'] * 1e9 / hp['tokens']:.0f} bytes per cached token (GB rounded to 0.01 by "
                              f"the server's line)")
    loads = [r[c]["load1"] for res in results.values() for r in res.get("rows", []) for c in CONDITIONS]
    head = (f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} CPU cores "
            f"(1-minute load average during the turns: {min(loads):.1f} .. {max(loads):.1f}), "
            f"SmolLM2-135M-Instruct, float32 weights, `python benchmarks/agent_sessions.py` "
            f"(wall time per format: " + ", ".join(f"{f} {r['wall_s']:.0f} s" for f, r in results.items()) + ").\n\n")
    return head + "\n".join(lines) + "\n\n" + "\n".join(host_lines) + f"\n\n![TTFT per condition]({svg_name})\n"


if __name__ == "__main__":
    sys.exit(main())
