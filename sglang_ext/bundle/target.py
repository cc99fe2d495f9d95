"""Unpack the offline bundle on a GPU machine and serve a tiny model through stock launch_server (stdlib only).

    python3 serve_tiny.py [--source DIR] [--dir DIR] [--model mimo-d128] [--port 30000]
                          [--check] [-- LAUNCH_SERVER_ARGS...]

The machine needs Python 3.12 with torch, Triton and torchvision (CUDA or ROCm builds) and a GPU; nothing is
downloaded. Steps:
unpack the two archives next to this script (once), unpack its wheels into `sglang-ext-bundle/site` (once), create the
tiny checkpoint MODEL from its config with the carried tokenizer (sglang_ext.models.tiny), then run
`python -m sglang.launch_server` on the portable GPU platform with PYTHONPATH set to the bundle. `--check` only
imports SGLang's server entry point and the modules the platform serves, and exits.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

BUNDLE_DIR = "sglang-ext-bundle"
DEPS_ARCHIVE, EXT_ARCHIVE, SCRIPT = "sglang-ext-deps.tar.xz", "sglang-ext.tar.xz", "serve_tiny.py"
_UNPACKED = ".unpacked"

# SGLang's server entry point and the modules the portable GPU platform serves (what --check imports).
SERVER_MODULES = (
    "sglang.launch_server", "sglang.srt.entrypoints.http_server", "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager", "sglang.srt.managers.scheduler", "sglang.srt.managers.tp_worker",
    "sglang.srt.model_executor.model_runner", "sglang.srt.models.llama", "sglang.srt.models.qwen3",
    "sglang.srt.models.qwen3_moe", "sglang.srt.models.qwen3_5", "sglang.srt.models.mimo_mtp",
    "sglang.srt.layers.attention.triton_backend", "sglang.srt.layers.attention.hybrid_linear_attn_backend",
    "sglang.srt.layers.moe.fused_moe_triton.layer", "sglang.srt.layers.sampler", "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.memory_pool_host", "sglang.srt.managers.cache_controller",
    "sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.ngram_worker", "sglang_ext.plugin",
    "sglang_ext.platform.gpu", "sglang_ext.kvcache.triton_backend", "transformers",
)


def unpack(source: Path, dest: Path) -> Path:
    """Extract the two archives in `source` into `dest` and the wheels into `<bundle>/site` (once); return the
    bundle folder."""
    bundle = dest / BUNDLE_DIR
    if not (bundle / _UNPACKED).is_file():
        for name in (DEPS_ARCHIVE, EXT_ARCHIVE):
            with tarfile.open(source / name, "r:xz") as tar:
                tar.extractall(dest, filter="data")
        site = bundle / "site"
        site.mkdir(exist_ok=True)
        for wheel in sorted((bundle / "wheels").glob("*.whl")):
            _unpack_wheel(wheel, site)
        (bundle / _UNPACKED).write_text("ok\n")
    return bundle


def _unpack_wheel(wheel: Path, site: Path) -> None:
    """A wheel's files into `site`: its purelib / platlib data folders go to the root, scripts and headers nowhere."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            target = site.joinpath(*parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(info))
            mode = info.external_attr >> 16
            if mode:
                target.chmod(mode & 0o777 or 0o644)


def environment(bundle: Path, base: dict | None = None) -> dict:
    """The environment the bundle's processes run with: the bundle first on PYTHONPATH, the portable GPU platform,
    the carried tokenizer for tiny checkpoints, models under the bundle unless SGLANG_EXT_HOME is set."""
    env = dict(os.environ if base is None else base)
    paths = [str(bundle / "python"), str(bundle / "site")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("SGLANG_EXT_PLATFORM", "portable_gpu")
    env["SGLANG_EXT_TOKENIZER_DIR"] = str(bundle / "tokenizer")
    env.setdefault("SGLANG_EXT_HOME", str(bundle / "home"))
    return env


def create_tiny(bundle: Path, name: str, env: dict) -> Path:
    """Create tiny checkpoint `name` (sglang_ext.models.tiny) on this machine; return its folder."""
    done = subprocess.run([sys.executable, "-m", "sglang_ext.models", "prepare", "--tiny", name], check=False,
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"creating tiny model {name} failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def check_torch(env: dict) -> None:
    """Stop with one line unless torch, Triton and torchvision (which SGLang imports at start-up and whose compiled
    ops must match this torch build) import here."""
    code = "import torch, triton, torchvision; print(torch.__version__, triton.__version__, torchvision.__version__)"
    done = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"the bundle needs torch, Triton and the torchvision built for this torch on this machine: "
                         f"{last}")
    print(f"torch / Triton / torchvision: {done.stdout.strip()}", flush=True)


def check_imports(env: dict) -> int:
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('imported', len(sys.argv) - 1)"
    return subprocess.run([sys.executable, "-c", code, *SERVER_MODULES], check=False, env=env).returncode


def main(argv=None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(prog="serve_tiny.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=here, help="folder holding the two archives (default: here)")
    parser.add_argument("--dir", type=Path, default=here, help="where to unpack (default: next to this script)")
    parser.add_argument("--model", default="mimo-d128", help="tiny model name (sglang_ext.models.tiny.TINY_MODELS)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--check", action="store_true", help="only import the served modules and exit")
    parser.add_argument("server_args", nargs=argparse.REMAINDER, help="-- then arguments for launch_server")
    args = parser.parse_args(argv)
    if sys.version_info[:2] != (3, 12):
        print(f"warning: the bundle's wheels are for Python 3.12; this is {sys.version.split()[0]}", file=sys.stderr)
    bundle = unpack(args.source, args.dir)
    env = environment(bundle)
    check_torch(env)
    if args.check:
        return check_imports(env)
    model = create_tiny(bundle, args.model, env)
    extra = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
               "--port", str(args.port), *extra]
    print(" ".join(command), flush=True)
    os.execve(sys.executable, command, env)


if __name__ == "__main__":
    sys.exit(main())
