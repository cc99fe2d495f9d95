"""Pack the offline bundle (core: no SGLang import; reads installed distributions through importlib.metadata).

The bundle is a folder of three files; both archives unpack into one folder `sglang-ext-bundle/`:
  sglang-ext-deps.tar.xz  python/    SGLang's sources (less contents.SGLANG_LEFT_OUT and compiled files) and every
                                     contents.PURE distribution, each with its dist-info
                          wheels/    cp312 wheels of contents.BINARY, for the target's Python
                          tokenizer/ the built-in model's tokenizer files (tiny checkpoints created on the target)
                          manifest.json
  sglang-ext.tar.xz       python/sglang_ext and its dist-info (SGLang finds the plugin through its entry points)
  serve_tiny.py           target.py: unpacks both on the target and serves
The dependency archive depends only on this environment, so it is built once per content hash in a cache folder
(compressing ~190 MB with xz takes minutes); sglang_ext's archive is built on every pack.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

from sglang_ext.bundle import contents
from sglang_ext.bundle.target import BUNDLE_DIR, DEPS_ARCHIVE, EXT_ARCHIVE, SCRIPT

SIZE_LIMIT = 64 << 20
TARGET_PYTHON = "3.12"
TARGET_PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
_SKIPPED_SUFFIXES = (".pyc", ".so", ".pyd")
_FORMAT_VERSION = 1  # bump when the archive layout changes (part of the cache key)


class BundleError(RuntimeError):
    pass


def _distribution(name: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise BundleError(f"distribution {name!r} is not installed in {sys.prefix}; the bundle copies it from here")


def _copy_distribution(name: str, dest: Path, left_out: tuple[str, ...] = ()) -> int:
    """Copy an installed distribution's files (as its RECORD lists them) under dest; returns bytes copied."""
    dist = _distribution(name)
    root = Path(dist.locate_file(""))
    copied = 0
    for entry in dist.files or ():
        rel = str(entry)
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith(_SKIPPED_SUFFIXES):
            continue
        if rel.endswith("/RECORD") or (any(rel == p or rel.startswith(p + "/") for p in left_out)
                                       and not _kept_in_left_out(rel)):
            continue
        source = root / rel
        if not source.is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += source.stat().st_size
    return copied


def _left_out_of(name: str) -> tuple[str, ...]:
    """Paths of distribution `name` that stay out of the bundle (transformers' untraced model folders, less what
    _kept_in_left_out keeps of them)."""
    if name != "transformers":
        return ()
    models = Path(_distribution(name).locate_file("transformers/models"))
    return tuple(f"transformers/models/{d.name}" for d in sorted(models.iterdir())
                 if d.is_dir() and d.name != "__pycache__" and d.name not in contents.TRANSFORMERS_MODELS)


@functools.cache
def tokenizer_lookup_folders() -> tuple[str, ...]:
    """transformers' model folders AutoTokenizer may import while it finds a tokenizer class by name: for a class
    such as Qwen2Tokenizer it imports, in mapping order, every model type's folder that maps to the class until one
    defines it (the first for Qwen2Tokenizer is audioflamingo3), and a missing folder stops the server."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    return tuple(sorted({model_type_to_module_name(t) for t in TOKENIZER_MAPPING_NAMES}))


def _kept_in_left_out(rel: str) -> bool:
    return rel in tokenizer_lookup_files()


@functools.cache
def tokenizer_lookup_files() -> frozenset[str]:
    """Of the left-out transformers model folders on the tokenizer lookup path: __init__.py, the tokenization
    files and the modules they import relatively (a normalizer beside them, another model's tokenization file),
    so the lookup imports each folder and finds the class or moves on. A few hundred KB of sources."""
    models = Path(_distribution("transformers").locate_file("transformers/models"))
    keep: set[str] = set()
    todo = [models / folder / "__init__.py" for folder in tokenizer_lookup_folders()]
    todo += [f for folder in tokenizer_lookup_folders() for f in sorted((models / folder).glob("tokenization_*.py"))]
    while todo:
        path = todo.pop()
        if not path.is_file() or path in keep:
            continue
        keep.add(path)
        if path.name == "__init__.py":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for module in re.findall(r"^\s*from \.(\w+) import", text, re.MULTILINE):
            todo.append(path.parent / f"{module}.py")
        for folder, module in re.findall(r"^\s*from \.\.(\w+)\.(\w+) import", text, re.MULTILINE):
            todo += [models / folder / "__init__.py", models / folder / f"{module}.py"]
    return frozenset(f"transformers/models/{p.relative_to(models)}" for p in keep)


def _copy_sglang_ext(dest: Path) -> int:
    """sglang_ext from its source folder (an editable install has no file list) plus a dist-info with its entry
    points."""
    import sglang_ext

    source = Path(sglang_ext.__file__).parent
    copied = 0
    for path in sorted(source.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in _SKIPPED_SUFFIXES:
            continue
        target = dest / "sglang_ext" / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied += path.stat().st_size
    dist = _distribution("sglang-ext")
    info = dest / f"sglang_ext-{dist.version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang-ext\nVersion: {dist.version}\n")
    (info / "entry_points.txt").write_text(dist.read_text("entry_points.txt") or "")
    (info / "top_level.txt").write_text("sglang_ext\n")
    return copied


def top_level_names(name: str) -> set[str]:
    """The top-level files and folders an installed distribution owns in its site folder (dist-info included)."""
    names = set()
    for entry in _distribution(name).files or ():
        first = str(entry).split("/")[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            names.add(first)
    return names


def with_torch() -> list[str]:
    """contents.WITH_TORCH and, recursively, their installed requirements (extras not counted): what a machine
    with torch and Triton installed has."""
    from packaging.requirements import Requirement

    seen: dict[str, None] = {}
    todo = list(contents.WITH_TORCH)
    while todo:
        name = todo.pop(0)
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = None
        for text in _distribution(name).requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    carried = {n.lower().replace("_", "-") for n in (*contents.PURE, *contents.BINARY)}
    return [name for name in seen if name not in carried]


def wheel_requirements() -> list[str]:
    """`name==version` of every contents.BINARY distribution as installed here."""
    return [f"{name}=={_distribution(name).version}" for name in contents.BINARY]


def download_wheels(cache: Path, python: str = TARGET_PYTHON) -> list[Path]:
    """The cp312 wheels of contents.BINARY (the versions installed here), fetched into `cache` once with pip."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = wheel_requirements()
    tag = "cp" + python.replace(".", "")

    def present(requirement: str) -> Path | None:
        name, version = requirement.split("==")
        stem = f"{name.replace('-', '_').lower()}-{version}-"
        return next((w for w in cache.glob("*.whl") if w.name.lower().startswith(stem)
                     and (f"-{tag}-" in w.name or "-abi3-" in w.name or "-none-" in w.name)), None)

    missing = [r for r in wanted if present(r) is None]
    if missing:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--python-version", python, "--implementation", "cp", "--abi", tag, "--abi", "abi3",
                   "--abi", "none", *(a for p in TARGET_PLATFORMS for a in ("--platform", p)), "--platform", "any",
                   "--dest", str(cache), *missing]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise BundleError(f"pip could not fetch cp{python} wheels of {', '.join(missing)}: "
                              f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    wheels = [present(r) for r in wanted]
    absent = [r for r, w in zip(wanted, wheels) if w is None]
    if absent:
        raise BundleError(f"no cp{python} wheel of {', '.join(absent)} in {cache}")
    return wheels


def _tokenizer_dir() -> Path:
    from sglang_ext.models.builtin import prepare

    return prepare()


def deps_key(wheels: list[Path], tokenizer_dir: Path) -> str:
    """Content hash of everything the dependency archive holds: the lists, each copied distribution's RECORD (its
    files' hashes), the wheels and the tokenizer files."""
    from sglang_ext.models.tiny import _TOKENIZER_FILES

    digest = hashlib.sha256(json.dumps([contents.PURE, contents.BINARY, contents.SGLANG_LEFT_OUT,
                                        contents.TRANSFORMERS_MODELS, sorted(tokenizer_lookup_files()), TARGET_PYTHON,
                                        _FORMAT_VERSION]).encode())
    for name in ("sglang", *contents.PURE):
        dist = _distribution(name)
        digest.update(f"{name}=={dist.version}\n".encode() + (dist.read_text("RECORD") or "").encode())
    for wheel in wheels:
        digest.update(wheel.name.encode() + wheel.read_bytes())
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            digest.update(name.encode() + (tokenizer_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def _stage_deps(folder: Path, wheels: list[Path], tokenizer_dir: Path) -> dict:
    """SGLang, the pure-Python distributions, the wheels and the tokenizer under `folder`; returns the manifest."""
    from sglang_ext.models.tiny import _TOKENIZER_FILES

    python_dir = folder / "python"
    sizes = {"sglang": _copy_distribution("sglang", python_dir, contents.SGLANG_LEFT_OUT)}
    for name in contents.PURE:
        sizes[name] = _copy_distribution(name, python_dir, _left_out_of(name))
    (folder / "wheels").mkdir(parents=True)
    for wheel in wheels:
        shutil.copy2(wheel, folder / "wheels" / wheel.name)
    (folder / "tokenizer").mkdir()
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, folder / "tokenizer" / name)
    manifest = {"python": TARGET_PYTHON, "sglang": _distribution("sglang").version,
                "with_torch": with_torch(),
                "pure": {name: _distribution(name).version for name in contents.PURE},
                "wheels": sorted(w.name for w in wheels), "source_bytes": sizes}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _archive(folder: Path, archive: Path) -> None:
    """A tar.xz of `folder`'s files under BUNDLE_DIR/, sorted, times and owners zeroed (same files, same bytes)."""

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    tmp = archive.with_name(archive.name + ".partial")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=f"{BUNDLE_DIR}/{path.relative_to(folder)}", recursive=False, filter=normalize)
    tmp.replace(archive)


def deps_archive(cache: Path, tokenizer_dir: Path | None = None) -> tuple[Path, dict]:
    """The dependency archive for this environment, built once per content hash under `cache`."""
    wheels = download_wheels(cache / "wheels")
    tokenizer_dir = tokenizer_dir or _tokenizer_dir()
    key = deps_key(wheels, tokenizer_dir)
    archive = cache / f"{DEPS_ARCHIVE.removesuffix('.tar.xz')}-{key}.tar.xz"
    manifest_file = archive.with_suffix(".json")
    if not (archive.is_file() and manifest_file.is_file()):
        folder = cache / f"staging-{key}"
        shutil.rmtree(folder, ignore_errors=True)
        manifest = _stage_deps(folder, wheels, tokenizer_dir)
        _archive(folder, archive)
        shutil.rmtree(folder)
        manifest_file.write_text(json.dumps(manifest, indent=1) + "\n")
    return archive, json.loads(manifest_file.read_text())


def pack(out: Path, cache: Path, tokenizer_dir: Path | None = None) -> dict:
    """Write into `out`: DEPS_ARCHIVE (SGLang, transformers, dependencies, wheels, tokenizer), EXT_ARCHIVE
    (sglang_ext) and serve_tiny.py; refuse a bundle whose two archives together exceed SIZE_LIMIT.

    Returns the manifest plus "files" (name -> bytes) and "total_bytes"."""
    out.mkdir(parents=True, exist_ok=True)
    deps, manifest = deps_archive(cache, tokenizer_dir)
    shutil.copy2(deps, out / DEPS_ARCHIVE)
    folder = out / "staging-sglang_ext"
    shutil.rmtree(folder, ignore_errors=True)
    _copy_sglang_ext(folder / "python")
    _archive(folder, out / EXT_ARCHIVE)
    shutil.rmtree(folder)
    shutil.copy2(Path(__file__).with_name("target.py"), out / SCRIPT)
    files = {name: (out / name).stat().st_size for name in (DEPS_ARCHIVE, EXT_ARCHIVE, SCRIPT)}
    total = sum(files.values())
    if total > SIZE_LIMIT:
        raise BundleError(f"the bundle in {out} is {total / 2**20:.1f} MiB, over the {SIZE_LIMIT >> 20} MiB limit")
    return {**manifest, "sglang_ext": _distribution("sglang-ext").version, "files": files, "total_bytes": total}
