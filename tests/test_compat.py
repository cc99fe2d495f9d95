"""Every SGLang name sglang-ext reaches through compat.py exists in the pinned SGLang's source.

Names are checked on the source text (ast), not by importing: many of those modules import CUDA-only code. A hook
target or lazy name that a new SGLang release renamed or removed fails here, by name, instead of at server start.
The call signature of every function sglang-ext hooks is compared (inspect.signature) with the one its hooks
were written for, compat.HOOKED_SIGNATURES.
"""

import ast
import importlib
import importlib.util
import inspect
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


# --- call signatures (compat.HOOKED_SIGNATURES) ------------------------------------------------------------------
# Modules whose source cannot be imported on this platform (sglang-ext provides a module of the same name on the
# CPU platform): their function's signature is read from the source text.
_SOURCE_ONLY = {compat.SPEC_RECONSTRUCT_TREE_MODULE}


def _bare(sig: inspect.Signature) -> str:
    """The signature without annotations, as compat.HOOKED_SIGNATURES records it."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _source_signature(target: str) -> inspect.Signature:
    path, attrs = _split(target)
    body = ast.parse(path.read_text()).body
    for attr in attrs[:-1]:
        body = _defines(body, attr).body
    fn = _defines(body, attrs[-1])
    assert isinstance(fn, ast.FunctionDef), f"{target} is not a function in {path}"
    fn = ast.FunctionDef(name=fn.name, args=fn.args, body=[ast.Pass()], decorator_list=[], returns=None)
    for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg]:
        if arg is not None:
            arg.annotation = None
    namespace = {}
    exec(compile(ast.fix_missing_locations(ast.Module([fn], [])), str(path), "exec"), namespace)  # noqa: S102 (a def)
    return inspect.signature(namespace[fn.name])


def _signature(target: str) -> inspect.Signature:
    _, attrs = _split(target)
    module = target[: -len(".".join(attrs)) - 1]
    if module in _SOURCE_ONLY:
        return _source_signature(target)
    obj = importlib.import_module(module)
    for attr in attrs:
        obj = getattr(obj, attr)
    return inspect.signature(obj)


@pytest.mark.parametrize("target", sorted(compat.HOOKED_SIGNATURES))
def test_hooked_function_has_the_signature_our_hooks_expect(target):
    got = _bare(_signature(target))
    assert got == compat.HOOKED_SIGNATURES[target], (
        f"{target}: SGLang's signature is {got}; sglang-ext's hooks were written for "
        f"{compat.HOOKED_SIGNATURES[target]} (compat.HOOKED_SIGNATURES)")


def test_every_hook_target_and_helper_has_a_recorded_signature():
    names = {value for name, value in vars(compat).items() if name.startswith("HOOK_") and isinstance(value, str)}
    names |= {f"{module}.{fn}" for module, fns in compat.SPEC_EAGLE_HELPERS.items() for fn in fns}
    missing = sorted(names - set(compat.HOOKED_SIGNATURES))
    assert not missing, f"no entry in compat.HOOKED_SIGNATURES for {missing}"


def test_a_changed_signature_fails(monkeypatch):
    target = compat.HOOK_TORCH_NATIVE_FORWARD_EXTEND
    monkeypatch.setitem(compat.HOOKED_SIGNATURES, target, "(self, q, k, v, layer, forward_batch)")
    with pytest.raises(AssertionError, match=r"forward_extend: SGLang's signature is .*save_kv_cache=True\)"):
        test_hooked_function_has_the_signature_our_hooks_expect(target)
