"""The offline bundle (sglang_ext/bundle): size, contents, and SGLang's server imports from it in a clean interpreter.

The bundle is packed once for the module with `pack()` (the dependency archive is cached by content hash under
$SGLANG_EXT_HOME/bundle-cache: a first build compresses ~190 MB with xz, minutes on 2 cores; later packs reuse it).

The clean interpreter: `python -S -E` (no site-packages, no PYTHONPATH, no .pth files, so the editable sglang_ext
install is invisible) with sys.path set to the unpacked bundle's python/ folder, then a folder of links to this
environment's torch, Triton, torchvision and their installed requirements (what the GPU machine has), then links to
the installed copies of the wheels' distributions: the wheels are for Python 3.12 and this interpreter is 3.11, so the same
distributions at the same versions stand in for them (test_wheels_match_the_stand_ins checks the versions). In it,
portable_gpu_process.py fakes torch's device queries as an H200, asks for the portable GPU platform, imports the
served modules and resolves the server arguments; every module it loads must come from those folders or the standard
library.
"""

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from server import ServerProcess

from sglang_ext.bundle import contents, pack, target
from sglang_ext.env import ext_home

PROCESS = Path(__file__).with_name("portable_gpu_process.py")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    result = pack.pack(out, ext_home() / "bundle-cache")
    return out, result


@pytest.fixture(scope="module")
def unpacked(bundle, tmp_path_factory):
    out, _ = bundle
    return target.unpack(out, tmp_path_factory.mktemp("target"))


def _link_distributions(names, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    site = Path(sysconfig.get_paths()["purelib"])
    for name in names:
        for top in pack.top_level_names(name):
            link = folder / top
            if not link.exists():
                link.symlink_to(site / top)


def test_bundle_size_and_contents(bundle):
    out, result = bundle
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    assert files == result["files"]
    assert set(files) == {target.DEPS_ARCHIVE, target.EXT_ARCHIVE, target.SCRIPT}
    assert result["total_bytes"] == sum(files.values()) <= pack.SIZE_LIMIT, f"{result['total_bytes'] / 2**20:.1f} MiB"
    assert result["sglang"] == "0.5.23" and result["python"] == "3.12"
    assert set(result["pure"]) == set(contents.PURE) and "transformers" in result["pure"]
    assert len(result["wheels"]) == len(contents.BINARY)
    # CPython 3.12 or stable-ABI wheels; soundfile's is Python-only with its libsndfile built for manylinux
    assert all("-cp312-" in w or "-abi3-" in w or ("-none-" in w and "manylinux" in w)
               for w in result["wheels"]), result["wheels"]


def test_unpacked_layout(unpacked):
    python = unpacked / "python"
    assert (python / "sglang" / "launch_server.py").is_file() and (python / "transformers" / "__init__.py").is_file()
    assert (python / "sglang_ext" / "platform" / "gpu.py").is_file()
    entry_points = next(python.glob("sglang_ext-*.dist-info")) / "entry_points.txt"
    assert "portable_cpu = sglang_ext.platform:activate" in entry_points.read_text()
    for part in contents.SGLANG_LEFT_OUT:
        assert not (python / part).exists(), part
    assert not list(python.rglob("*.so")) and not list(python.rglob("*.pyc"))
    # the wheels were unpacked for Python 3.12
    site = unpacked / "site"
    assert (site / "pydantic_core" / "__init__.py").is_file()
    assert not (site / "numpy").exists()  # torchvision brings numpy and Pillow
    assert list((site / "pydantic_core").glob("_pydantic_core.cpython-312-*.so"))
    assert (unpacked / "tokenizer" / "tokenizer.json").is_file()


def test_wheels_match_the_stand_ins(bundle):
    _, result = bundle
    for name in contents.BINARY:
        version = pack._distribution(name).version
        stem = f"{name.replace('-', '_').lower()}-{version}-"
        assert any(w.lower().startswith(stem) for w in result["wheels"]), (name, version)
    for wheel in (bundle[0] / target.DEPS_ARCHIVE,):
        assert wheel.stat().st_size > 0
    core_wheel = next(w for w in result["wheels"] if w.startswith("pydantic_core-"))
    assert "manylinux" in core_wheel and zipfile.is_zipfile(ext_home() / "bundle-cache" / "wheels" / core_wheel)


def test_clean_interpreter_imports_the_server(unpacked, model_dir, tmp_path):
    links = tmp_path / "links"
    _link_distributions(pack.with_torch(), links / "torch")
    _link_distributions(contents.BINARY, links / "binary")
    paths = [str(unpacked / "python"), str(links / "torch"), str(links / "binary")]
    allowed = (*paths, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
    runner = (
        "import json, runpy, sys\n"
        f"sys.path[:0] = {paths!r}\n"
        f"sys.argv = [{str(PROCESS)!r}, 'cuda', {model_dir!r}]\n"
        f"runpy.run_path({str(PROCESS)!r}, run_name='__main__')\n"
        # files of loaded modules (torch.ops / torch.classes carry no path; __mp_main__ is this script)
        f"outside = sorted(n for n, m in list(sys.modules.items()) if n != '__mp_main__' "
        f"and (getattr(m, '__file__', None) or '').startswith('/') and not m.__file__.startswith({allowed!r}))\n"
        "print(json.dumps({'outside': outside, 'modules': len(sys.modules)}))\n"
        # AutoTokenizer finds a class by name through model folders the bundle otherwise leaves out (the tiny
        # Qwen2-type checkpoint's Qwen2Tokenizer: audioflamingo3 first): every class's lookup must import
        "from transformers.models.auto import tokenization_auto as ta\n"
        "missing = {}\n"
        "for name in sorted(set(filter(None, ta.TOKENIZER_MAPPING_NAMES.values()))):\n"
        "    try:\n"
        "        ta.tokenizer_class_from_name(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        missing[name] = str(exc)\n"
        "print(json.dumps({'missing': missing, 'qwen2': ta.tokenizer_class_from_name('Qwen2Tokenizer').__name__}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SGLANG"))}
    environ["SGLANG_EXT_PLATFORM"] = "portable_gpu"
    done = subprocess.run([sys.executable, "-S", "-E", "-c", runner], check=False, env=environ, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    served, loaded, tokenizers = (json.loads(line) for line in done.stdout.strip().splitlines()[-3:])
    assert tokenizers == {"missing": {}, "qwen2": "Qwen2Tokenizer"}
    assert served["failed_imports"] == {}
    assert served["platform"] == "PortableGpuPlatform"
    assert served["defaults"]["attention_backend"] == "triton" and served["defaults"]["device"] == "cuda"
    assert served["sgl_kernel"] == "GuardedModule"
    assert loaded["outside"] == [] and loaded["modules"] > 3000


class _CleanServer(ServerProcess):
    """launch_server with `python -S`: no site-packages, only PYTHONPATH (the multiprocessing children inherit it)."""

    def command(self) -> list[str]:
        python, *rest = super().command()
        return [python, "-S", *rest]


def test_bundle_serves_in_a_clean_interpreter(unpacked, model_dir, tmp_path):
    """The whole server start (what run_server imports only when it starts, the scheduler and detokenizer processes)
    with only the bundle and torch's distributions: the built-in model on the CPU platform with int8 KV, greedy."""
    links = tmp_path / "links"
    _link_distributions(pack.with_torch(), links / "torch")
    _link_distributions(contents.BINARY, links / "binary")  # this Python's builds of the bundle's cp312 wheels
    paths = [str(unpacked / "python"), str(links / "torch"), str(links / "binary")]
    environ = {"PYTHONPATH": os.pathsep.join(paths), "SGLANG_EXT_PLATFORM": "portable_cpu",
               "SGLANG_EXT_TOKENIZER_DIR": str(unpacked / "tokenizer")}
    server = _CleanServer(model_dir, ["--kv-cache-dtype", "int8", "--max-total-tokens", "2048"], env=environ,
                          name="bundle-clean")
    try:
        server.start()
        out = server.generate("The capital of France is", max_new_tokens=8)
        log = server.log_text()
    finally:
        server.stop()
    assert "Paris" in out["text"]
    # the plugin came from the bundle (its entry point) and verified its hooks in the scheduler process too
    assert "kv-cache-dtype int8/octave_k3v4/octave_k3v3" in log and log.count("hooks verified") >= 2
    assert f"{unpacked / 'python'}/sglang/launch_server.py" in log  # SGLang's own warning names the bundle's file
