"""The GPU serving run: stock `python -m sglang.launch_server` with sglang-ext on the portable GPU platform, every KV
format, through the offline bundle (stdlib only; the GPU machine has Python 3.12, torch, Triton and no network).

    python3 tools/gpu_serving_run.py --bundle build/bundle --out "$OUT" [--phases correctness,hicache,nextn,speed]
    python tools/gpu_serving_run.py --reference --out docs/benchmarks/gpu-serving-reference.json   # CPU, float32

GPU mode unpacks the bundle (`python -m sglang_ext.bundle pack --out build/bundle` made it), creates the tiny
checkpoints there (mimo-d128: dense head_dim 128 with an MTP layer; qwen3_5: Qwen3.5-style hybrid, head_dim 256 /
rotary 64, with an MTP layer) and a Llama-3-8B-shaped config for speed (`--load-format dummy`: random weights, no
checkpoint file), then per `--kv-cache-dtype` (auto, int8, octave_k3v4, octave_k3v3):
  correctness  4 prompts greedy in one batch vs the CPU reference (first diverging token per prompt), a radix hit
  hicache      a prompt pushed out to host and back with --hicache-io-backend kernel (page_first)
  nextn        NEXTN chain (topk 1, 4 draft tokens) and tree (topk 2, 6) on both checkpoints (--nextn-models,
               --nextn-kinds): greedy equal to plain decoding of the same checkpoint and format
  speed        decode tokens/s at batch 1 and 8, context 4k and 32k; pool capacity (tokens) at the same memory;
               NEXTN vs plain at batch 1 on mimo-d128
Every step's result (or its error) is appended to OUT/gpu_serving.json as soon as it is known, so a run cut short
keeps what it measured. Reference mode serves the same checkpoints and prompts on the portable CPU platform in
float32 (this environment, no bundle) and writes the greedy tokens the GPU run compares with.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("auto", "int8", "octave_k3v4", "octave_k3v3")
MODELS = ("mimo-d128", "qwen3_5")
PROMPTS = (
    "The capital of France is",
    "Write a short story about a robot who learns to paint. Once upon a time,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List three facts about the moon:\n1.",
)
NEW_TOKENS = 24
NEXTN = {"chain": (1, 4), "tree": (2, 6)}  # (topk, draft tokens), 3 steps
SPEED_CONTEXTS, SPEED_BATCHES, SPEED_NEW_TOKENS = (4096, 32768), (1, 8), 128
# Llama-3-8B's attention shape (32 layers, 32 q / 8 KV heads, head_dim 128) with the bundle's tokenizer vocabulary.
SPEED_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
SESSION_TURN = " ".join(f"Step {i}: the agent reads file {i % 9} and edits line {i * 3}." for i in range(48))
HICACHE_DEVICE_TOKENS = 600
MEM_FRACTION = "0.6"
PORT_TAKEN = "address already in use"
SERVER_TIMEOUT = 600.0  # seconds a server may take to become healthy (--server-timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict | None = None, timeout: float = 600) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    try:
        return json.loads(body or b"{}")
    except json.JSONDecodeError:  # plain-text answers (/flush_cache)
        return {"text": body.decode(errors="replace")}


class Server:
    """One launch_server process; its log goes to `log_dir`/<name>.log."""

    def __init__(self, python: str, env: dict, model: Path, args: list[str], name: str, log_dir: Path):
        self.port, self.name = free_port(), name
        self.log_path = log_dir / f"{name}.log"
        command = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
                   "--port", str(self.port), "--enable-cache-report", *args]
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed by stop())
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.started = time.time()

    def wait(self, timeout: float | None = None) -> float:
        timeout = SERVER_TIMEOUT if timeout is None else timeout
        while time.time() - self.started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.process.returncode}: {self.tail()}")
            if PORT_TAKEN in self.log_path.read_text(errors="replace"):  # the server lingers after the bind error
                raise RuntimeError(f"{self.name}: {PORT_TAKEN}")
            try:
                post(self.port, "/health_generate", timeout=30)
                return time.time() - self.started
            except OSError:
                time.sleep(2)
        raise RuntimeError(f"{self.name} not healthy after {timeout} s: {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def generate(self, prompt=None, input_ids=None, max_new_tokens=NEW_TOKENS, ignore_eos=False) -> dict:
        body = {"sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}}
        body.update({"text": prompt} if input_ids is None else {"input_ids": input_ids})
        return post(self.port, "/generate", body)

    def batch(self, prompts) -> list[dict]:
        """All prompts at once (one batch), greedy."""
        out = [None] * len(prompts)

        def one(i):
            out[i] = self.generate(prompts[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def info(self) -> dict:
        for path in ("/get_server_info", "/server_info"):
            try:
                return post(self.port, path)
            except OSError:
                continue
        return {}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def divergence(got: list[int], want: list[int]) -> int | None:
    """Index of the first differing token (None when equal)."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


class Run:
    def __init__(self, out: Path, python: str, env: dict, dtype: str):
        self.out, self.python, self.env, self.dtype = out, python, env, dtype
        self.log_dir = out / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": []}

    def record(self, step: str, **fields) -> None:
        self.results["steps"].append({"step": step, **fields})
        (self.out / "gpu_serving.json").write_text(json.dumps(self.results, indent=1) + "\n")
        print(json.dumps({"step": step, **fields})[:400], flush=True)

    def server(self, model: Path, args: list[str], name: str, env: dict | None = None, dtype: str | None = None):
        for attempt in range(3):  # a free port can be taken by one of SGLang's own sockets before uvicorn binds it
            server = Server(self.python, env or self.env, model, ["--dtype", dtype or self.dtype, *args], name,
                            self.log_dir)
            try:
                server.startup_s = server.wait()
                return server
            except Exception as exc:
                server.stop()
                if PORT_TAKEN not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def step(self, name: str, fn) -> None:
        """Run fn() -> dict of fields; an exception is recorded with its message, and the run goes on."""
        began = time.time()
        try:
            fields = fn()
        except Exception as exc:  # noqa: BLE001 (recorded in the results: the run is a checklist)
            self.record(name, ok=False, error=f"{type(exc).__name__}: {str(exc)[-1500:]}", seconds=time.time() - began)
            return
        self.record(name, ok=True, seconds=round(time.time() - began, 1), **fields)


# SGLang's chunked Gated DeltaNet kernel (its GPU prefill path) takes bf16 / fp16 only: the hybrid serves in bf16
# on the GPU, so its comparison with the CPU float32 reference reports where the tokens part, not equality.
GPU_DTYPE = {"qwen3_5": "bfloat16"}


def correctness(run: Run, model: Path, name: str, fmt: str, reference: dict) -> dict:
    server = run.server(model, ["--kv-cache-dtype", fmt, "--mem-fraction-static", MEM_FRACTION], f"{name}-{fmt}",
                        dtype=GPU_DTYPE.get(name))
    try:
        outputs = server.batch(list(PROMPTS))
        again = server.generate(PROMPTS[0])
        # A second session turn (a long first turn + its answer + more), then the same turn cold after a cache flush.
        # On a GPU SGLang runs a hybrid with --mamba-radix-cache-strategy extra_buffer, which keeps the recurrent
        # state every --mamba-track-interval (256) tokens: the first turn is longer than two intervals. Token ids,
        # not text: random weights answer with token sequences that do not survive a text round trip.
        long_ids = post(server.port, "/tokenize", {"prompt": SESSION_TURN})["tokens"]
        first_turn = server.generate(input_ids=long_ids)
        turn = long_ids + first_turn["output_ids"] + long_ids[:16]
        warm_turn = server.generate(input_ids=turn)
        post(server.port, "/flush_cache")
        cold_turn = server.generate(input_ids=turn)
    finally:
        server.stop()
    ids = [o["output_ids"] for o in outputs]
    want = reference.get(name, {}).get(fmt)
    fields = {"output_ids": ids, "startup_s": round(server.startup_s, 1), "dtype": GPU_DTYPE.get(name, run.dtype),
              "radix_cached_tokens": again["meta_info"]["cached_tokens"],
              "radix_same_output": again["output_ids"] == ids[0],
              "turn_tokens": len(turn), "turn_cached_tokens": warm_turn["meta_info"]["cached_tokens"],
              "turn_cold_cached_tokens": cold_turn["meta_info"]["cached_tokens"],
              "turn_same_as_cold": warm_turn["output_ids"] == cold_turn["output_ids"]}
    if want is not None:
        fields["first_divergence_vs_cpu_fp32"] = [divergence(g, w) for g, w in zip(ids, want)]
    return fields


def hicache(run: Run, model: Path, fmt: str) -> dict:
    prompt = " ".join(f"Item {i} in the market is sold by trader {i * 7 % 13}." for i in range(40)) + " Answer:"
    other = " ".join(f"Story two, line {i}: the river ran {i % 5} miles." for i in range(40)) + " Summary:"
    server = run.server(model, ["--kv-cache-dtype", fmt, "--max-total-tokens", str(HICACHE_DEVICE_TOKENS),
                                "--enable-hierarchical-cache", "--hicache-io-backend", "kernel",
                                "--hicache-mem-layout", "page_first", "--hicache-size", "1"], f"hicache-{fmt}")
    try:
        server.generate(prompt, max_new_tokens=8)
        warm = server.generate(prompt, max_new_tokens=8)
        other_out = server.generate(other, max_new_tokens=2)
        again = server.generate(prompt, max_new_tokens=8)
    finally:
        server.stop()
    details = again["meta_info"].get("cached_tokens_details") or {}
    return {"device_hit": (warm["meta_info"].get("cached_tokens_details") or {}).get("device", 0),
            "host_hit": details.get("host", 0), "pushed_out": warm["meta_info"]["prompt_tokens"]
            + other_out["meta_info"]["prompt_tokens"] > HICACHE_DEVICE_TOKENS,
            "same_output": again["output_ids"] == warm["output_ids"]}


def nextn_args(kind: str) -> list[str]:
    topk, drafts = NEXTN[kind]
    return ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk",
            str(topk), "--speculative-num-draft-tokens", str(drafts)]


def nextn(run: Run, model: Path, name: str, fmt: str, kind: str, plain: list[list[int]] | None) -> dict:
    server = run.server(model, ["--kv-cache-dtype", fmt, "--mem-fraction-static", MEM_FRACTION, *nextn_args(kind)],
                        f"nextn-{kind}-{name}-{fmt}", dtype=GPU_DTYPE.get(name))
    try:
        outputs = server.batch(list(PROMPTS))
    finally:
        server.stop()
    ids = [o["output_ids"] for o in outputs]
    verify = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outputs)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    return {"output_ids": ids, "equal_to_plain": None if plain is None else ids == plain,
            "accept_length": round(tokens / verify, 3) if verify else None}


def _timed_batch(server: Server, context: int, batch: int, new_tokens: int, seed: int) -> float:
    """Seconds for `batch` concurrent requests of `context` fresh random tokens (no cache hit), eos ignored."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 49152) for _ in range(context)] for _ in range(batch)]
    threads = [threading.Thread(target=server.generate, kwargs={"input_ids": ids, "max_new_tokens": new_tokens,
                                                                  "ignore_eos": True}) for ids in prompts]
    began = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - began


def decode_speed(server: Server, context: int, batch: int) -> dict:
    """Decode tokens/s at `batch` x `context`: the time of SPEED_NEW_TOKENS tokens less the time of one (prefill and
    first token), over the batch x (SPEED_NEW_TOKENS - 1) tokens decoded in between."""
    first = _timed_batch(server, context, batch, 1, seed=context + batch)
    full = _timed_batch(server, context, batch, SPEED_NEW_TOKENS, seed=context + batch + 1000)
    return {"tokens_per_s": round(batch * (SPEED_NEW_TOKENS - 1) / max(full - first, 1e-9), 1),
            "prefill_s": round(first, 3), "total_s": round(full, 3)}


def speed(run: Run, model: Path, fmt: str) -> dict:
    env = {**run.env, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    server = run.server(model, ["--kv-cache-dtype", fmt, "--load-format", "dummy", "--context-length", "33280",
                                "--mem-fraction-static", "0.85", "--max-running-requests", "8"], f"speed-{fmt}", env,
                        dtype="bfloat16")
    try:
        info = server.info()
        server.generate(input_ids=list(range(3, 259)), max_new_tokens=8, ignore_eos=True)  # warm-up
        cells = {f"b{b}_ctx{c}": decode_speed(server, c, b) for c in SPEED_CONTEXTS for b in SPEED_BATCHES}
    finally:
        server.stop()
    return {"pool_tokens": info.get("max_total_num_tokens"), "startup_s": round(server.startup_s, 1), **cells}


def nextn_speed(run: Run, model: Path, fmt: str) -> dict:
    out = {}
    for label, extra in (("plain", []), ("chain", nextn_args("chain"))):
        server = run.server(model, ["--kv-cache-dtype", fmt, "--mem-fraction-static", MEM_FRACTION, *extra],
                            f"nextn-speed-{label}-{fmt}", dtype="bfloat16")
        try:
            server.generate(PROMPTS[0], max_new_tokens=8)
            began = time.time()
            result = server.generate(PROMPTS[1], max_new_tokens=256, ignore_eos=True)
            elapsed = time.time() - began
        finally:
            server.stop()
        meta = result["meta_info"]
        out[label] = {"tokens_per_s": round(meta["completion_tokens"] / elapsed, 1),
                      "accept_length": round(meta["completion_tokens"] / meta["spec_verify_ct"], 3)
                      if meta.get("spec_verify_ct") else None}
    out["speedup"] = round(out["chain"]["tokens_per_s"] / out["plain"]["tokens_per_s"], 3)
    return out


def gpu_main(args) -> int:
    sys.path.insert(0, str(REPO))
    from sglang_ext.bundle.target import check_torch, create_tiny, environment, unpack

    bundle = unpack(args.bundle, args.work)
    env = environment(bundle)
    run = Run(args.out, sys.executable, env, args.dtype)
    reference = json.loads(args.reference_file.read_text()) if args.reference_file.is_file() else {}
    run.record("environment", python=sys.version.split()[0], bundle=str(bundle),
               reference=bool(reference), dtype=args.dtype)
    check_torch(env)
    models = {name: create_tiny(bundle, name, env) for name in MODELS}
    speed_model = bundle / "home" / "models" / "llama8b-shape"
    speed_model.mkdir(parents=True, exist_ok=True)
    (speed_model / "config.json").write_text(json.dumps(SPEED_CONFIG, indent=1) + "\n")
    for file in (bundle / "tokenizer").iterdir():
        (speed_model / file.name).write_bytes(file.read_bytes())
    plain: dict = {}
    for fmt in args.formats:
        if "correctness" in args.phases:
            for name in args.models:
                run.step(f"correctness {name} {fmt}", lambda n=name, f=fmt: correctness(run, models[n], n, f, reference))
                last = run.results["steps"][-1]
                if last.get("ok"):
                    plain[(name, fmt)] = last["output_ids"]
        if "hicache" in args.phases:
            run.step(f"hicache kernel io {fmt}", lambda f=fmt: hicache(run, models["mimo-d128"], f))
        if "nextn" in args.phases:
            for name in args.nextn_models:
                for kind in args.nextn_kinds:
                    run.step(f"nextn {kind} {name} {fmt}",
                             lambda n=name, k=kind, f=fmt: nextn(run, models[n], n, f, k, plain.get((n, f))))
        if "speed" in args.phases:
            run.step(f"speed {fmt}", lambda f=fmt: speed(run, speed_model, f))
            run.step(f"nextn speed {fmt}", lambda f=fmt: nextn_speed(run, models["mimo-d128"], f))
    return 0


def reference_main(args) -> int:
    """Greedy tokens of PROMPTS per model and format on the portable CPU platform in float32."""
    from sglang_ext.models.tiny import prepare_tiny

    env = {**os.environ, "SGLANG_EXT_PLATFORM": "portable_cpu"}
    out: dict = json.loads(args.out.read_text()) if args.out.is_file() else {}
    run = Run(args.work / "reference", sys.executable, env, "float32")
    for name in MODELS:
        model = prepare_tiny(name)
        for fmt in args.formats:
            if fmt in out.get(name, {}):
                continue
            try:
                server = run.server(model, ["--kv-cache-dtype", fmt, "--max-total-tokens", "2048"],
                                    f"ref-{name}-{fmt}")
            except RuntimeError as exc:  # recorded: the GPU run then has no reference for this pair
                out.setdefault("errors", {})[f"{name} {fmt}"] = str(exc)[-800:]
                args.out.write_text(json.dumps(out) + "\n")
                continue
            try:
                out.setdefault(name, {})[fmt] = [o["output_ids"] for o in server.batch(list(PROMPTS))]
                out.get("errors", {}).pop(f"{name} {fmt}", None)
            finally:
                server.stop()
            args.out.write_text(json.dumps(out) + "\n")
            print(f"reference {name} {fmt}: {[x[:6] for x in out[name][fmt]]}", flush=True)
    return 0


def main(argv=None) -> int:
    global SERVER_TIMEOUT
    parser = argparse.ArgumentParser(prog="tools/gpu_serving_run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reference", action="store_true", help="compute the CPU float32 reference instead")
    parser.add_argument("--bundle", type=Path, default=REPO / "build" / "bundle")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sglang-ext-gpu-run"))
    parser.add_argument("--reference-file", type=Path, default=REPO / "docs" / "benchmarks" / "gpu-serving-reference.json")
    parser.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS), help="correctness checkpoints")
    parser.add_argument("--nextn-models", type=lambda s: s.split(","), default=list(MODELS))
    parser.add_argument("--nextn-kinds", type=lambda s: s.split(","), default=list(NEXTN))
    parser.add_argument("--formats", type=lambda s: s.split(","), default=list(FORMATS))
    parser.add_argument("--phases", type=lambda s: s.split(","), default=["correctness", "hicache", "nextn", "speed"])
    parser.add_argument("--dtype", default="float32", help="--dtype of the correctness / hicache / nextn servers")
    parser.add_argument("--server-timeout", type=float, default=SERVER_TIMEOUT,
                        help="seconds a server may take to become healthy")
    args = parser.parse_args(argv)
    SERVER_TIMEOUT = args.server_timeout
    if args.reference:
        return reference_main(args)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
