"""NEXTN on a GPU without SGLang, measured: the built-in model and a train-draft MTP layer decoding held-out prompts
through `tools.native_loop` (our kernels over each KV format, every stage a CUDA-graph replay), plain
decoding against speculative rounds of 3 chain drafts, batch 1 and 8. Tokens per second of each, the speed-up, the
accept length, and whether both gave the same tokens.

The lent H200 has no SGLang and takes 64 MiB a call, so the inputs travel as a folder made here (`pack`): the
built-in model's GGUF in two parts (98 MB; Q4_1 / Q8_0, dequantized there exactly as `prepare` does here: the
loader's bf16 tensors are checked against checksums of the prepared folder's), the MTP layer's tensors from a
checkpoint (8 MB), the held-out prompts' token ids, and the `gguf` package. Two calls, the machine kept warm
between them (30 s):

    # here
    .venv/bin/python tools/spec_gpu_loop.py pack --mtp CHECKPOINT_DIR --out .spec_gpu   # .spec_gpu ignored
    # device call 1: carry [".spec_gpu/a"]; command: mkdir -p /tmp/sg && cp .spec_gpu/a/* /tmp/sg/
    # device call 2: carry [".spec_gpu/b"]; command:
    #   cp -r .spec_gpu/b/* /tmp/sg/ &&
    #   PYTHONUNBUFFERED=1 python3 tools/spec_gpu_loop.py run --inputs /tmp/sg --out $OUT
    # here: the loop's rounds against train-draft's acceptance simulation on 3 held-out continuations (15 minutes)
    TRITON_INTERPRET=1 .venv/bin/python tools/spec_gpu_loop.py agree --inputs .spec_gpu/all --heldout HELD.pt
    # here, no GPU (the Triton interpreter, minutes a token; a smoke test of the whole path):
    TRITON_INTERPRET=1 .venv/bin/python tools/spec_gpu_loop.py run --inputs .spec_gpu/all --prompts 1 \\
        --new-tokens 8 --formats bf16 --batches 1 --out /tmp/sgl
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools.native_loop import DraftWeights, NativeNextn, TargetWeights  # noqa: E402

GGUF_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
              "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
PARTS = ("model.gguf.0", "model.gguf.1")


def _meta(reader, key):
    field = reader.fields[key]
    return field.parts[field.data[0]].tolist()[0]


def load_gguf_llama(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """A llama-architecture GGUF -> (Hugging Face state dict in bf16, config dict): every tensor dequantized to
    float32 by the gguf package and rounded to bf16, q / k rows put back in Hugging Face's order (llama.cpp's
    converter interleaves each head's two RoPE halves), as transformers' GGUF loader does."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(path))
    heads, kv_heads = _meta(r, "llama.attention.head_count"), _meta(r, "llama.attention.head_count_kv")
    config = {"hidden_size": _meta(r, "llama.embedding_length"),
              "intermediate_size": _meta(r, "llama.feed_forward_length"),
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": _meta(r, "llama.block_count"),
              "rms_norm_eps": _meta(r, "llama.attention.layer_norm_rms_epsilon"),
              "rope_theta": _meta(r, "llama.rope.freq_base"), "vocab_size": _meta(r, "llama.vocab_size"),
              "tie_word_embeddings": not any(t.name == "output.weight" for t in r.tensors)}
    config["head_dim"] = config["hidden_size"] // heads
    state = {}
    for t in r.tensors:
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).reshape([int(n) for n in reversed(t.shape)])
        kind = t.name.split(".")[-2]
        if kind in ("attn_q", "attn_k"):
            n = heads if kind == "attn_q" else kv_heads
            w = w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            _, layer, kind, _ = t.name.split(".")
            name = f"model.layers.{layer}.{GGUF_NAMES[kind]}.weight"
        state[name] = w.to(torch.bfloat16)
    return state, config


def checksums(state: dict[str, torch.Tensor]) -> dict[str, str]:
    return {k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
            for k, v in sorted(state.items())}


# ---------------------------------------------------------------------------------------------------------- pack

def pack(args) -> int:
    """The device's inputs, in two folders of under 60 MB each (a: the GGUF's first part; b: the rest) and `all`
    (links to both, for a run here)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from sglang_ext.models.builtin import default_model_dir, find_gguf
    from sglang_ext.models.mtp_checkpoint import MTP_PREFIX, load_base_weights

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    a, b, both = out / "a", out / "b", out / "all"
    for d in (a, b, both):
        d.mkdir(parents=True)
    gguf = find_gguf()
    data = gguf.read_bytes()
    half = len(data) * 4 // 7  # part a carries the larger half: part b also carries the MTP layer and gguf
    (a / PARTS[0]).write_bytes(data[:half])
    (b / PARTS[1]).write_bytes(data[half:])
    # the device loads the GGUF with load_gguf_llama: its tensors must be the prepared folder's, bit for bit
    state, config = load_gguf_llama(gguf)
    prepared = load_base_weights(default_model_dir())
    prepared = {k: v for k, v in prepared.items() if k != "lm_head.weight" or not config["tie_word_embeddings"]}
    want = checksums(prepared)
    got = checksums(state)
    if got != want:
        bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise SystemExit(f"load_gguf_llama differs from the prepared model in {len(bad)} tensors: {bad[:5]}")
    mtp = {}
    with safe_open(str(Path(args.mtp) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            if name.startswith(MTP_PREFIX):
                mtp[name[len(MTP_PREFIX):]] = f.get_tensor(name)
    save_file(mtp, str(b / "mtp.safetensors"))
    training = Path(args.mtp) / "draft-training.json"
    held = torch.load(args.heldout, weights_only=False)
    prompts = [s.tokens[:s.prompt_len].tolist() for s in held[:args.prompts]]
    continuations = [s.tokens[s.prompt_len:].tolist() for s in held[:args.prompts]]
    meta = {"config": config, "checksums": want, "eos_token_id": 2, "mtp_checkpoint": str(args.mtp),
            "mtp_training": json.loads(training.read_text()) if training.is_file() else None,
            "prompts": prompts, "cpu_greedy_continuations": continuations,
            "heldout_source": f"{args.heldout} (benchmarks/spec_acceptance.py's continuations, float32 on the CPU)"}
    (b / "inputs.json").write_text(json.dumps(meta))
    import gguf as gguf_package
    shutil.copytree(Path(gguf_package.__file__).parent, b / "gguf", ignore=shutil.ignore_patterns("__pycache__"))
    for d in (a, b):
        for f in d.iterdir():
            (both / f.name).symlink_to(f.resolve())
    for d in (a, b):
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        print(f"{d}: {size / 1e6:.1f} MB")
    return 0


# ---------------------------------------------------------------------------------------------------------- run

def _timed(fn) -> tuple[float, object]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, result


def _stage_times(loop: NativeNextn, names, reps: int = 50) -> dict[str, float]:
    """Median replay time (us) of each stage, after a prefill (the state moves on with each replay)."""
    if not torch.cuda.is_available():
        return {}
    out = {}
    for name in names:
        run = loop.stage(name)
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000)
        out[name] = round(statistics.median(times), 1)
    return out


def run(args) -> int:
    inputs = Path(args.inputs)
    sys.path.insert(0, str(inputs))  # the gguf package travels with the inputs
    meta = json.loads((inputs / "inputs.json").read_text())
    gguf = Path(args.workdir) / "model.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    with open(gguf, "wb") as f:
        for part in PARTS:
            f.write((inputs / part).read_bytes())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t, (state, config) = _timed(lambda: load_gguf_llama(gguf))
    if checksums(state) != meta["checksums"]:
        raise SystemExit("the GGUF's tensors differ from the prepared model's checksums")
    print(f"target loaded in {t:.1f} s, checksums equal to the prepared model's", flush=True)
    from safetensors.torch import load_file
    target = TargetWeights(state, config, dtype, device)
    draft = DraftWeights(load_file(str(inputs / "mtp.safetensors")), dtype, device)
    prompts = meta["prompts"][:args.prompts]
    filler = [tok for c in meta["cpu_greedy_continuations"][::-1] for tok in c]
    steps, new, check = 3, args.new_tokens, args.check_every
    capacity = new + (check + 1) * (steps + 1)
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "dtype": str(dtype), "new_tokens": new, "steps": steps, "check_every": check,
              "mtp_training": meta.get("mtp_training"), "rows": []}
    import triton
    result["triton"] = triton.__version__
    for prefix, fmt, batch, topk in itertools.product(args.prefix_tokens, args.formats, args.batches, args.topk):
        longest = max(len(p) for p in prompts) + prefix
        loop = NativeNextn(target, draft, fmt, batch=batch, max_ctx=longest + capacity + 2 * (steps + 1),
                           steps=steps, capacity=capacity, topk=topk)
        t_capture, _ = _timed(lambda: (loop.capture(spec=False), loop.capture(spec=True)))
        plain_s = spec_s = 0.0
        plain_n = spec_n = 0
        same, accept = 0, []
        groups = [prompts[i:i + batch] for i in range(0, len(prompts) - batch + 1, batch)]
        for g in groups:
            g = [filler[:prefix] + p for p in g]
            loop.prefill(g)
            t_plain, _ = _timed(lambda: loop.decode(new, spec=False, check_every=check * (steps + 1)))
            plain_s += t_plain
            plain_n += int((loop.out_len - 1).sum())
            plain = loop.results(new)
            loop.prefill(g)
            t_spec, _ = _timed(lambda: loop.decode(new, spec=True, check_every=check))
            spec_s += t_spec
            spec_n += int((loop.out_len - 1).sum())
            spec = loop.results(new)
            same += sum(a == b for a, b in zip(plain["tokens"], spec["tokens"]))
            for rounds in spec["accept"]:
                accept += rounds
        loop.prefill([filler[:prefix] + p for p in groups[0]])
        stage_us = _stage_times(loop, ("decode", "draft", "verify", "extend"))
        row = {"format": fmt, "batch": batch, "topk": topk, "prefix_tokens": prefix,
               "requests": len(groups) * batch,
               "plain_tokens_per_s": round(plain_n / plain_s, 1),
               "spec_tokens_per_s": round(spec_n / spec_s, 1),
               "speedup": round((spec_n / spec_s) / (plain_n / plain_s), 3),
               "accept_length": round(sum(accept) / len(accept), 3), "rounds": len(accept),
               "same_tokens_as_plain": f"{same}/{len(groups) * batch}", "stage_us": stage_us,
               "capture_s": round(t_capture, 1)}
        if stage_us:  # what the step-time model of earlier runs would say from this run's own stages
            round_us = stage_us["draft"] + stage_us["verify"] + stage_us["extend"]
            row["stage_model_speedup"] = round(row["accept_length"] * stage_us["decode"] / round_us, 3)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "spec_gpu_loop.json").write_text(json.dumps(result, indent=1))
    return 0


def agree(args) -> int:
    """The loop's rounds against draft_acceptance's simulation (what train-draft reports) on held-out continuations:
    float32 on this machine, the kernels under the Triton interpreter (about 5 minutes for 40 tokens)."""
    from safetensors.torch import load_file

    from tools.draft_training.draft_acceptance import (
        accept_length,
        chain_drafts,
        decode_walk,
        tree_accept_length,
        tree_drafts,
    )
    from tools.draft_training.mtp_layer import MtpLayer

    inputs = Path(args.inputs)
    sys.path.insert(0, str(inputs))
    gguf = Path(args.workdir) / "model.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    gguf.write_bytes(b"".join((inputs / part).read_bytes() for part in PARTS))
    state, config = load_gguf_llama(gguf)
    target = TargetWeights(state, config, torch.float32, "cpu")
    weights = load_file(str(inputs / "mtp.safetensors"))
    draft = DraftWeights(weights, torch.float32, "cpu")
    mtp = MtpLayer(config).eval()
    mtp.load_state_dict({k: v.float() for k, v in weights.items()})
    held = torch.load(args.heldout, weights_only=False)
    steps, new, ok = 3, args.new_tokens, True
    for i in args.which:
        seq = held[i]
        prompt = seq.tokens[:seq.prompt_len].tolist()
        loop = NativeNextn(target, draft, args.format, batch=1, max_ctx=len(prompt) + new + 80, steps=steps,
                           capacity=new + 12, topk=args.topk)
        loop.prefill([prompt])
        seconds, _ = _timed(lambda: loop.decode(new, spec=True, check_every=2))
        res = loop.results(new)
        cpu = seq.tokens[seq.prompt_len:seq.prompt_len + new].tolist()
        same = next((j for j, (a, b) in enumerate(zip(res["tokens"][0], cpu)) if a != b), min(new, len(cpu)))
        last = min(len(seq.tokens) - 1, seq.prompt_len + same - 1) - steps  # rounds within the equal tokens
        ts = torch.arange(seq.prompt_len - 1, last + 1)
        targets = torch.stack([seq.greedy[ts + s] for s in range(1, steps + 1)], dim=-1)
        with torch.no_grad():
            if args.topk == 1:
                lengths = accept_length(chain_drafts(mtp, target.embed, target.lm_head, seq, steps)[ts], targets)
            else:
                paths, depths = tree_drafts(mtp, target.embed, target.lm_head, seq, steps, args.topk, steps + 1)
                lengths = tree_accept_length(paths[ts], depths[ts], targets)
            simulated = decode_walk(lengths.tolist())
        row = {"prompt": i, "seconds": round(seconds), "tokens_equal_to_cpu_continuation": same,
               "loop_rounds": res["accept"][0], "simulated_rounds": simulated,
               "agree": res["accept"][0][:len(simulated)] == simulated}
        ok &= row["agree"]
        print(json.dumps(row), flush=True)
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="build the device's input folders here")
    p.add_argument("--mtp", required=True, help="a train-draft checkpoint folder")
    p.add_argument("--heldout", required=True,
                   help="benchmarks/spec_acceptance.py's --cache file (the held-out prompts and CPU continuations)")
    p.add_argument("--prompts", type=int, default=80)
    p.add_argument("--out", default=".spec_gpu")
    r = sub.add_parser("run", help="measure (on the GPU; under the Triton interpreter elsewhere)")
    r.add_argument("--inputs", required=True)
    r.add_argument("--workdir", default="/tmp/spec_gpu_loop")
    r.add_argument("--out", required=True)
    r.add_argument("--prompts", type=int, default=80)
    r.add_argument("--new-tokens", type=int, default=128)
    r.add_argument("--check-every", type=int, default=8, help="rounds between the host's looks at the lengths")
    r.add_argument("--formats", nargs="+", default=["bf16", "int8", "octave_k3v4", "octave_k3v3"])
    r.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    r.add_argument("--topk", type=int, nargs="+", default=[1, 4],
                   help="draft shapes: 1 = chain of 3; 4 = trees of topk 4 with 3 verified drafts")
    r.add_argument("--prefix-tokens", type=int, nargs="+", default=[0],
                   help="earlier text before each prompt (other held-out continuations), for longer contexts")
    g = sub.add_parser("agree", help="the loop's rounds against the acceptance simulation, here (CPU)")
    g.add_argument("--inputs", required=True)
    g.add_argument("--heldout", required=True, help="benchmarks/spec_acceptance.py's --cache file")
    g.add_argument("--workdir", default="/tmp/spec_gpu_loop")
    g.add_argument("--which", type=int, nargs="+", default=[0, 1, 2], help="held-out sequences")
    g.add_argument("--new-tokens", type=int, default=40)
    g.add_argument("--format", default="bf16")
    g.add_argument("--topk", type=int, default=1, help="1: chain drafts; > 1: trees of 3 verified drafts")
    args = ap.parse_args()
    return {"pack": pack, "run": run, "agree": agree}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
