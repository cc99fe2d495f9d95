"""Time train-draft's corpus decoder (`draft_corpus.decode_batch`) against the same file at another git revision.

    python benchmarks/corpus_decode.py --against HEAD~1 [--rounds 2] [--prompts 128] [--steps 128]

Both versions decode the same training prompts with the built-in model in the corpus dtype (bf16 where the CPU
computes it natively), alternated in one process so that a host whose speed drifts (these 2-core VMs do, by 10-20 %
within minutes) shows it in both. Prints one line per batch (seconds, rows whose tokens equal the current
version's, the largest hidden-state difference) and the mean per version, then one JSON line.
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ext.models import draft_corpus  # noqa: E402
from sglang_ext.models.builtin import default_model_dir  # noqa: E402
from sglang_ext.models.train_draft import DraftTrainConfig, load_base  # noqa: E402


def module_at(revision: str, folder: Path):
    source = subprocess.run(["git", "show", f"{revision}:sglang_ext/models/draft_corpus.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = folder / "draft_corpus_at_revision.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("draft_corpus_at_revision", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="git revision of the other decode_batch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_base(default_model_dir())
    dtype = DraftTrainConfig().resolved_corpus_dtype()
    model.to(dtype)
    pool = draft_corpus.train_prompts(tokenizer, 0)
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"current": draft_corpus, args.against: module_at(args.against, Path(tmp))}
        seconds = {name: [] for name in versions}
        for r in range(args.rounds):
            chunk = pool[(r % 2) * args.prompts:(r % 2 + 1) * args.prompts]
            outputs = {}
            for name, module in versions.items():
                start = time.perf_counter()
                outputs[name] = module.decode_batch(model, chunk, args.steps, None, tokenizer.eos_token_id)
                seconds[name].append(time.perf_counter() - start)
            ref = outputs["current"]
            for name, (new, hidden, _) in outputs.items():
                same = int((new == ref[0]).all(1).sum()) if new.shape == ref[0].shape else 0
                diff = (hidden - ref[1]).abs().max().item() if hidden.shape == ref[1].shape else float("nan")
                print(f"round {r} {name}: {seconds[name][-1]:.2f} s, rows equal to current {same}/{len(new)}, "
                      f"hidden max diff {diff:.3g}", flush=True)
    means = {name: sum(v) / len(v) for name, v in seconds.items()}
    for name, mean in means.items():
        print(f"{name}: mean {mean:.2f} s over {len(seconds[name])} batches of {args.prompts} x {args.steps}")
    print(json.dumps({"dtype": str(dtype).removeprefix("torch."), "prompts": args.prompts, "steps": args.steps,
                      "seconds": {k: [round(x, 2) for x in v] for k, v in seconds.items()},
                      "mean": {k: round(v, 2) for k, v in means.items()}}))


if __name__ == "__main__":
    main()
