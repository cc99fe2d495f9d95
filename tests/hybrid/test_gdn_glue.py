"""The glue that installs the torch GDN ops into SGLang on the CPU platform (sglang_ext/hybrid/hooks.py)."""

import importlib
import inspect

import pytest

from sglang_ext import compat
from sglang_ext.hybrid.hooks import TORCH_OPS


def _parameters(fn) -> list[tuple[str, object]]:
    """(name, default) of each parameter, **kwargs left out (SGLang's causal_conv1d_fn swallows extras)."""
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD]


@pytest.mark.parametrize("name", sorted(compat.GDN_KERNEL_TARGETS))
def test_torch_op_takes_sglangs_arguments(name):
    """Same parameter names, order and defaults as the SGLang function it replaces, so every call site's
    positional and keyword arguments mean the same thing."""
    module, attr = compat.GDN_KERNEL_TARGETS[name].rsplit(".", 1)
    theirs = getattr(importlib.import_module(module), attr)
    assert _parameters(TORCH_OPS[name]) == _parameters(theirs), (
        f"{name}: SGLang {inspect.signature(theirs)} vs ours {inspect.signature(TORCH_OPS[name])}")


def test_every_target_has_a_torch_op():
    assert set(TORCH_OPS) == set(compat.GDN_KERNEL_TARGETS)
