"""Patching SGLang modules at the moment they are imported (for names that HookRegistry cannot reach).

HookRegistry resolves its targets when plugins load. Some names are out of its reach, and a meta-path finder
handles them, only for the module names registered here:
- speculative decoding on the CPU platform (`spec/hooks.py`): module attributes that are None there (REPLACE
  would re-bind every `None` in every loaded module), and a module that cannot be imported at all without
  sgl_kernel's CUDA build (`provide_module`);
- SSD-resident PLE (`ple/sglang_glue.py`): heavy model modules, patched only in the processes that import them
  (`after_import`).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections import defaultdict
from collections.abc import Callable

_after: dict[str, list[Callable[[types.ModuleType], None]]] = defaultdict(list)
_provided: dict[str, Callable[[types.ModuleType], None]] = {}
_applied: list[str] = []  # module names, one entry per after_import patch that ran


class _RunAfterExec(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        for fn in _after.pop(self._name, []):
            fn(module)
            _applied.append(self._name)


class _Provide(importlib.abc.Loader):
    def __init__(self, fill: Callable[[types.ModuleType], None]) -> None:
        self._fill = fill

    def create_module(self, spec):
        return None  # default module object

    def exec_module(self, module) -> None:
        self._fill(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname in _provided:
            return importlib.util.spec_from_loader(fullname, _Provide(_provided[fullname]))
        if fullname not in _after:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RunAfterExec(spec.loader, fullname)
        return spec


def _install_finder() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def after_import(module_name: str, fn: Callable[[types.ModuleType], None]) -> None:
    """Run fn(module) right after `module_name` executes (at once if it already has)."""
    if module_name in sys.modules:
        fn(sys.modules[module_name])
        _applied.append(module_name)
        return
    _after[module_name].append(fn)
    _install_finder()


def provide_module(module_name: str, fill: Callable[[types.ModuleType], None]) -> None:
    """Serve `module_name` from fill(module) instead of its source file. Must run before anything imports it."""
    if module_name in sys.modules:
        raise RuntimeError(f"{module_name} was imported before sglang-ext could provide it")
    _provided[module_name] = fill
    _install_finder()


def applied() -> list[str]:
    """Module names of the after_import patches that ran in this process (one entry per patch)."""
    return list(_applied)


def pending() -> dict[str, int]:
    """Module name -> after_import patches still waiting for its import."""
    return {name: len(fns) for name, fns in _after.items() if fns}


def provided() -> dict[str, bool]:
    """Module name -> whether the module now imported under that name is the one provide_module serves."""
    out = {}
    for name in _provided:
        spec = getattr(sys.modules.get(name), "__spec__", None)
        out[name] = name not in sys.modules or isinstance(getattr(spec, "loader", None), _Provide)
    return out
