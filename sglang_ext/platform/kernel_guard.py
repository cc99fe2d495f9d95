"""The kernel-library guard of the portable GPU platform (core: no SGLang import).

SGLang binds names from `sgl_kernel` at import time wherever torch reports CUDA or ROCm, and from `aiter` on ROCm
(its quantization package imports aiter unconditionally there). Once installed, the guard answers every
`import sgl_kernel...` / `import aiter...` of the process, whether or not the library is installed: names the
platform provides (platform/gpu_ops.py) are real torch ops; any other name imports, and calling it raises one line
naming the op and the platform. SGLang's own switches turn flashinfer and aiter off before SGLang reads them;
flashinfer is left to SGLang's availability check (no unconditional import on the served paths).
"""

import importlib.abc
import importlib.machinery
import os
import sys
import types

from sglang_ext.platform import gpu_ops

PLATFORM_NAME = "portable_gpu"
GUARDED_LIBRARIES = ("sgl_kernel", "aiter")
# SGLang's own switches, set before SGLang reads them: flashinfer and aiter off, and no start-up check of the
# installed sglang-kernel version (the launcher otherwise refuses to start on CUDA without the package).
LIBRARY_SWITCHES = {"SGLANG_IS_FLASHINFER_AVAILABLE": "false", "SGLANG_USE_AITER": "0",
                    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1"}


class UnprovidedOp:
    """Stands in for an sgl_kernel name this platform does not provide: importing it works (SGLang binds many
    names it never calls on our paths), calling it raises one line naming it. Attribute access yields the
    stand-in of the dotted name, so module-level references such as `scalar_types.uint4b8` import too."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is not provided by the {PLATFORM_NAME} platform")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return UnprovidedOp(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<{self._name}: not provided by {PLATFORM_NAME}>"


class GuardedModule(types.ModuleType):
    """`sgl_kernel` / `aiter` (or a submodule) as the platform serves it: provided names, else UnprovidedOp."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        key = f"{self.__name__}.{attr}"
        if key in gpu_ops.PROVIDED:
            return gpu_ops.PROVIDED[key]
        return UnprovidedOp(f"{self.__name__}.{attr}")


class _GuardLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = GuardedModule(spec.name)
        module.__path__ = []  # a package: `from sgl_kernel.kvcacheio import ...` resolves through the guard
        return module

    def exec_module(self, module) -> None:
        return None


class KernelLibraryGuard(importlib.abc.MetaPathFinder):
    """Meta-path finder that serves the guarded libraries and their submodules as GuardedModule."""

    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] not in GUARDED_LIBRARIES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _GuardLoader(), is_package=True)


def install_kernel_library_guard() -> None:
    """Put the guard first on sys.meta_path (once) and set SGLang's flashinfer / aiter switches.

    Refuses when a real guarded library is already imported: SGLang modules may hold its ops already."""
    for name, value in LIBRARY_SWITCHES.items():
        os.environ[name] = value
    if any(isinstance(f, KernelLibraryGuard) for f in sys.meta_path):
        return
    for library in GUARDED_LIBRARIES:
        loaded = sys.modules.get(library)
        if loaded is not None and not isinstance(loaded, GuardedModule):
            raise RuntimeError(f"the {PLATFORM_NAME} platform must be chosen before {library} is imported "
                               f"(it was imported from {getattr(loaded, '__file__', '?')})")
    sys.meta_path.insert(0, KernelLibraryGuard())
