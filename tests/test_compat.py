"""Every SGLang name sglang-ext reaches through compat.py exists in the pinned SGLang's source.

Checked on the source text (ast), not by importing: many of those modules import CUDA-only code. A hook target
or lazy name that a new SGLang release renamed or removed fails here, by name, instead of at server start.
"""

import ast
import importlib.util
from pathlib import Path

import pytest

from sglang_ext import compat

_SGLANG_ROOT = Path(importlib.util.find_spec("sglang").origin).parent


def _module_file(dotted: str) -> Path | None:
    rel = Path(*dotted.split(".")[1:])
    for candidate in (_SGLANG_ROOT / rel.with_suffix(".py"), _SGLANG_ROOT / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _split(target: str) -> tuple[Path, list[str]]:
    """The longest module prefix of a dotted target that is a file of SGLang's, and the attribute path after it."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = _module_file(".".join(parts[:cut]))
        if path is not None:
            return path, parts[cut:]
    raise AssertionError(f"{target}: no module of it exists in {_SGLANG_ROOT}")


def _defines(body: list[ast.stmt], name: str) -> ast.stmt | None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name
                                                                   for a in node.names):
            return node
        if isinstance(node, (ast.If, ast.Try)):  # conditional definitions (platform branches, optional imports)
            inner = [*node.body, *getattr(node, "orelse", []), *[s for h in getattr(node, "handlers", [])
                                                                  for s in h.body]]
            found = _defines(inner, name)
            if found is not None:
                return found
    return None


def _targets() -> list[tuple[str, str]]:
    out = [(name, value) for name, value in vars(compat).items()
           if name.startswith("HOOK_") and isinstance(value, str)]
    out += [(name, value.replace(":", ".")) for name, value in compat._LAZY.items()]
    return sorted(out)


@pytest.mark.parametrize("name,target", _targets(), ids=[n for n, _ in _targets()])
def test_target_exists_in_sglang_source(name, target):
    path, attrs = _split(target)
    body = ast.parse(path.read_text()).body
    for depth, attr in enumerate(attrs):
        node = _defines(body, attr)
        assert node is not None, f"compat.{name} = {target!r}: {'.'.join(attrs[:depth + 1])} not defined in {path}"
        if depth + 1 < len(attrs):
            assert isinstance(node, ast.ClassDef), f"compat.{name}: {attr} in {path} is not a class"
            body = node.body


def test_a_misspelt_target_fails():
    path, attrs = _split("sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backendd")
    cls = _defines(ast.parse(path.read_text()).body, attrs[0])
    assert cls is not None and _defines(cls.body, attrs[1]) is None
