"""One SGLang hook per target: every hook sglang-ext installs goes through `register` here.

SGLang's HookRegistry wraps the hooks of one target in registration order and warns when one target has more
than one AROUND hook. Several sglang-ext features hook the same SGLang function (the torch_native extend, the
HiCache host-pool choice, the CLI parser), and their registration order would then be the order the plugin
happens to call the features in. Instead, the first `register` on a target registers one AROUND hook with
HookRegistry, a dispatcher, and every sglang-ext hook on that target joins the dispatcher's chain:

- a target with one hook runs it as HookRegistry would (BEFORE / AFTER / AROUND / REPLACE, same contract);
- a target with hooks from several features runs them in the order `ORDER` declares for it, outermost first:
  the first feature listed is called by SGLang and calls the next, ..., the last one calls SGLang's function.
  An AFTER hook's own code therefore runs after everything listed below it; a REPLACE hook ends the chain.
  A second feature on a target without a declared order is refused when it registers.

A hook's feature is the `sglang_ext` subpackage (or top-level module) its function is defined in.
The chain is read when the hooked function is called (composed once per change, cached), so a hook added to a
target whose dispatcher HookRegistry already applied still runs. `targets()` is what `hook_check` verifies after
SGLang applies hooks.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import NamedTuple

from sglang_ext import compat

# Stacked targets: features outermost first (see the module docstring).
ORDER: dict[str, tuple[str, ...]] = {
    # spec answers TARGET_VERIFY batches itself; ple flattens a 3-D q (Gemma 3n) before SGLang's extend.
    compat.HOOK_TORCH_NATIVE_FORWARD_EXTEND: ("spec", "ple"),
    # platform (AROUND) turns SGLang's dense host pool into the portable one; hicache (AFTER) then puts its
    # compressed host pool in place for a compressed device pool's buffer info.
    compat.HOOK_GET_MHA_HOST_POOL_CLS: ("hicache", "platform"),
    # Each adds its own flag (AFTER): kvcache's --kv-cache-dtype choices first, then pp, then sessions.
    compat.HOOK_SERVER_ARGS_ADD_CLI_ARGS: ("sessions", "pp", "kvcache"),
    # Each reads its own flag (AFTER): platform's batch-invariant export first, then pp, then sessions.
    compat.HOOK_SERVER_ARGS_FROM_CLI_ARGS: ("sessions", "pp", "platform"),
}


class HookOrderError(RuntimeError):
    """Two features hook one target and ORDER does not say which runs first."""


class Hook(NamedTuple):
    feature: str
    hook_type: str  # HookType member name: BEFORE, AFTER, AROUND, REPLACE
    fn: Callable


_chains: dict[str, list[Hook]] = {}
_versions: dict[str, int] = {}
_composed: dict[str, tuple[Callable, int, Callable]] = {}  # target -> (original, version, composed call)
_dispatched: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # registry -> targets given a dispatcher


def feature_of(fn: Callable) -> str:
    module = getattr(fn, "__module__", "") or ""
    parts = module.split(".")
    return parts[1] if parts[0] == "sglang_ext" and len(parts) > 1 else module


def register(target: str, hook: Callable, hook_type) -> None:
    """Add `hook` to `target`'s chain (same arguments as HookRegistry.register). Registering the same function
    with the same type on a target again is a no-op. Raises HookOrderError for an undeclared stacking and
    TypeError for a class (class REPLACE is not chained)."""
    if isinstance(hook, type):
        raise TypeError(f"hook_chain: {hook.__name__} on {target}: classes are not chained")
    entry = Hook(feature_of(hook), hook_type.name, hook)
    chain = _chains.setdefault(target, [])
    if any(h.fn is hook and h.hook_type == entry.hook_type for h in chain):
        return
    ordered = _ordered(target, [*chain, entry])
    chain[:] = ordered
    _versions[target] = _versions.get(target, 0) + 1
    registry = compat.HookRegistry
    dispatched = _dispatched.setdefault(registry, set())
    if target not in dispatched:
        registry.register(target, _dispatcher(target), compat.HookType.AROUND)
        dispatched.add(target)


def _ordered(target: str, chain: list[Hook]) -> list[Hook]:
    features = list(dict.fromkeys(h.feature for h in chain))
    if len(features) < 2:
        return chain
    order = ORDER.get(target)
    unknown = [f for f in features if order is None or f not in order]
    if unknown:
        raise HookOrderError(f"hooks on {target} from {', '.join(features)}: hook_chain.ORDER does not place "
                             f"{', '.join(unknown)}")
    return sorted(chain, key=lambda h: order.index(h.feature))  # stable: one feature's hooks keep their order


def targets() -> list[str]:
    """Every target sglang-ext registered in this process, sorted."""
    return sorted(t for t, chain in _chains.items() if chain)


def chain(target: str) -> list[Hook]:
    """The hooks of `target`, outermost first (as they run)."""
    return list(_chains.get(target, []))


def _dispatcher(target: str) -> Callable:
    def dispatch(original, *args, **kwargs):
        cached = _composed.get(target)
        version = _versions[target]
        if cached is None or cached[0] is not original or cached[1] != version:
            cached = (original, version, _compose(_chains[target], original))
            _composed[target] = cached
        return cached[2](*args, **kwargs)

    dispatch.__qualname__ = dispatch.__name__ = f"sglang_ext_hooks[{'.'.join(target.split('.')[-2:])}]"
    return dispatch


def _compose(chain: list[Hook], original: Callable) -> Callable:
    call = original
    for hook in reversed(chain):  # innermost first
        call = _wrap(hook, call)
    return call


def _wrap(hook: Hook, inner: Callable) -> Callable:
    fn = hook.fn
    if hook.hook_type == "REPLACE":
        return fn
    if hook.hook_type == "AROUND":
        return functools.partial(fn, inner)
    if hook.hook_type == "BEFORE":
        def before(*args, **kwargs):
            changed = fn(*args, **kwargs)
            if changed is not None:
                args, kwargs = changed
            return inner(*args, **kwargs)
        return before
    if hook.hook_type == "AFTER":
        def after(*args, **kwargs):
            result = inner(*args, **kwargs)
            modified = fn(result, *args, **kwargs)
            return result if modified is None else modified
        return after
    raise ValueError(f"hook_chain: unknown hook type {hook.hook_type}")
