"""Every sglang-ext hook is in place, checked in each SGLang process right after SGLang applied the hooks.

SGLang's HookRegistry.apply_hooks logs a target it fails to patch (a renamed function, a moved module) and goes
on, so a feature would be silently off. The plugin runs `verify()` right after apply_hooks (compat's
`run_after_apply_hooks`) in the launcher, scheduler and detokenizer processes; it checks:

  hooks            every target in `hook_chain.targets()` is among the targets HookRegistry patched;
  import patches   every `import_patch.after_import` module not imported yet exists in SGLang (it is patched
                   when imported), none was imported past the patch, and every `provide_module` name is one
                   SGLang has and, if imported, is the provided module.

A failure is one line naming each target, with the installed and the supported SGLang version; the plugin turns
it into exit status 2 (the launcher stops; a scheduler that stops fails the launcher's start-up).
"""

from __future__ import annotations

import importlib.machinery
import pkgutil
import sys
from dataclasses import dataclass

from sglang_ext import compat, hook_chain, import_patch


class HookCheckError(RuntimeError):
    """Some hook or import-time patch of sglang-ext is not in place; the message is one line."""


@dataclass(frozen=True)
class HookCheck:
    hook_targets: int  # targets verified patched
    import_patches: int  # after_import / provide_module patches verified (applied, or pending on an existing module)


def module_exists(name: str) -> bool:
    """Whether `name` is a module on sys.path, found without importing it or its packages."""
    parts = name.split(".")
    search = None
    for depth in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), search)
        if spec is None:
            return False
        search = spec.submodule_search_locations
        if search is None and depth < len(parts) - 1:
            return False
    return True


def why_not_applied(target: str) -> str:
    """What resolving `target` the way HookRegistry does runs into (for the error line)."""
    obj_path, _, attr = target.rpartition(".")
    try:
        obj = pkgutil.resolve_name(obj_path)
    except (ImportError, AttributeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if not hasattr(obj, attr):
        return f"{obj_path} has no attribute {attr!r}"
    return "HookRegistry did not apply it (its log says why)"


def problems(registry=None) -> tuple[list[str], HookCheck]:
    """The failures (one phrase each, empty when all is in place) and what was verified."""
    applied = compat.hook_targets_applied(registry)
    targets = hook_chain.targets()
    out = [f"hook on {t} not applied ({why_not_applied(t)})" for t in targets if t not in applied]
    pending = import_patch.pending()
    for name in sorted(pending):
        if name in sys.modules:
            out.append(f"import-time patch of {name} did not run (imported past sglang-ext's import hook)")
        elif not module_exists(name):
            out.append(f"import-time patch of {name}: no such module")
    provided = import_patch.provided()
    for name, ours in sorted(provided.items()):
        if not module_exists(name):
            out.append(f"module {name} (provided by sglang-ext): no such module in SGLang")
        elif not ours:
            out.append(f"module {name} was imported from SGLang, not the one sglang-ext provides")
    patches = len(import_patch.applied()) + sum(pending.values()) + len(provided)
    return out, HookCheck(hook_targets=len(targets) - sum(t not in applied for t in targets), import_patches=patches)


def verify(registry=None) -> HookCheck:
    """Raise HookCheckError (one line) unless every hook and import-time patch is in place; else what was
    verified."""
    failures, check = problems(registry)
    if failures:
        raise HookCheckError(f"{'; '.join(failures)}. Installed SGLang {compat.installed_sglang_version()}, "
                             f"sglang-ext supports SGLang {compat.SGLANG_VERSION}")
    return check
