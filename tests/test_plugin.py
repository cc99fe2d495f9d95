"""The plugin is found through SGLang's own loader, its hooks are verified where SGLang applied them (one
hook per target, stacked features in their declared order), and bad input gives one clear line."""

import json
import logging
import os
import subprocess
import sys
import types
from collections import defaultdict
from typing import ClassVar

import pytest

from sglang_ext import compat, hook_chain, hook_check, import_patch

BROKEN_TARGET = "sglang.srt.server_args.ServerArgs.renamed_in_a_later_release"
PLUGIN_PROBE = r"""
import inspect, json, logging
logging.basicConfig(level=logging.WARNING)  # SGLang's hook warnings ("Multiple AROUND hooks ...") reach stderr
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, PLATFORM_PLUGINS_GROUP, load_plugins, load_plugins_by_group
general = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
platforms = load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
assert "sglang_ext" in general, sorted(general)
assert list(platforms) == ["portable_cpu"], sorted(platforms)
load_plugins()
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_ext import hook_chain
from sglang_ext.plugin import registered
print("REGISTERED", registered())
print("PLATFORM", platforms["portable_cpu"][0]())
chains = {t: [[h.feature, h.hook_type] for h in hook_chain.chain(t)] for t in hook_chain.targets()}
print("CHAINS", json.dumps(chains))
ours = {t: sum(src is not None and src.dist_name == "sglang-ext" for _, _, src in HookRegistry._hooks[t]) for t in chains}
print("HOOKREGISTRY", json.dumps(ours))  # other installed plugins may hook the same targets
def params(fn):  # the first parameter of a method, whatever our function names it
    ps = [p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(fn).parameters.values()]
    return [p.replace(name="self") if i == 0 and p.name in ("self", "pool", "runner") else p for i, p in enumerate(ps)]
import pkgutil
replaced = {t: [str(p) for p in params(h.fn)] for t in chains for h in hook_chain.chain(t) if h.hook_type == "REPLACE"}
sglang = {t: [str(p) for p in params(getattr(pkgutil.resolve_name(t.rsplit(".", 1)[0]), t.rsplit(".", 1)[1]).__wrapped__)]
          for t in replaced}
print("REPLACED", json.dumps({t: [replaced[t], sglang[t]] for t in replaced}), flush=True)
# A target SGLang cannot patch (as after a rename in a later release): SGLang's apply_hooks logs it and goes on,
# the plugin's check that runs right after it (the same wrapped apply_hooks load_plugins called) stops the process.
from sglang_ext import compat
hook_chain.register(BROKEN_TARGET, lambda result, *args, **kwargs: None, compat.HookType.AFTER)
HookRegistry.apply_hooks()
print("SERVED WITHOUT THE HOOK")
"""


def _run(cmd, env_extra=None, timeout=300):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def _probe_lines(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if line.split(" ", 1)[0].isupper())


@pytest.fixture(scope="module")
def probe():
    return _run([sys.executable, "-c", PLUGIN_PROBE.replace("BROKEN_TARGET", repr(BROKEN_TARGET))])


def test_sglang_loader_finds_and_loads_plugin(probe):
    r = probe
    assert "REPLACED " in r.stdout, r.stderr[-3000:]
    assert "REGISTERED ['sglang-ext" in r.stdout and "platform portable_cpu" in r.stdout, r.stdout
    assert "PLATFORM sglang_ext.platform.cpu.PortableCpuPlatform" in r.stdout, r.stdout
    out = _probe_lines(r.stdout)
    chains = json.loads(out["CHAINS"])
    # Checked right after SGLang applied the hooks, and said in the launcher's line.
    line = next(x for x in r.stderr.splitlines() if x.startswith("[sglang-ext] ") and " registered: " in x)
    assert f"hooks verified: {len(chains)} targets" in line, line
    # One HookRegistry hook per target; the stacked ones in hook_chain.ORDER's order; no SGLang warning about them.
    assert set(json.loads(out["HOOKREGISTRY"]).values()) == {1}, out["HOOKREGISTRY"]
    assert "Multiple AROUND hooks" not in r.stderr, r.stderr[-3000:]
    failed = [x for x in r.stderr.splitlines() if "Failed to apply hooks" in x]
    assert all(x.endswith(BROKEN_TARGET) for x in failed), failed  # only the probe's own broken one
    assert chains[compat.HOOK_TORCH_NATIVE_FORWARD_EXTEND] == [["spec", "AROUND"], ["ple", "AROUND"]]
    assert chains[compat.HOOK_GET_MHA_HOST_POOL_CLS] == [["hicache", "AFTER"], ["platform", "AROUND"]]
    for target, chain in chains.items():
        if len({feature for feature, _ in chain}) > 1:
            assert [f for f, _ in chain] == [f for f in hook_chain.ORDER[target] if f in dict(chain)], target
    # Every hooked function has its expected signature recorded (tests/test_compat.py checks them) ...
    assert not set(chains) - set(compat.HOOKED_SIGNATURES), sorted(set(chains) - set(compat.HOOKED_SIGNATURES))
    # ... and each function that replaces one of SGLang's takes the same parameters (a `**kwargs` of SGLang's may
    # be left out: an argument SGLang does not name then fails loudly instead of being ignored).
    for target, (ours, sglangs) in json.loads(out["REPLACED"]).items():
        if not any(p.startswith("**") for p in ours):
            sglangs = [p for p in sglangs if not p.startswith("**")]
        assert ours == sglangs, (target, ours, sglangs)


def test_unknown_platform_is_one_clear_line(model_dir):
    r = _run([sys.executable, "-m", "sglang_ext.serve", "--model-path", model_dir], {"SGLANG_PLATFORM": "nosuch"})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "SGLANG_PLATFORM='nosuch'" in lines[0] and "portable_cpu" in lines[0], r.stderr
    # Stock launch_server: SGLang's own discovery refuses it and names the installed platform.
    r = _run([sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir], {"SGLANG_PLATFORM": "nosuch"})
    assert r.returncode != 0
    assert "SGLANG_PLATFORM='nosuch' not found" in r.stderr and "'portable_cpu'" in r.stderr, r.stderr[-2000:]


def test_missing_model_folder_is_one_clear_line(tmp_path):
    missing = str(tmp_path / "no-such-model")
    r = _run([sys.executable, "-m", "sglang.launch_server", "--model-path", missing])
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"sglang-ext: error: --model-path {missing}: no such folder"], r.stderr[-2000:]


def test_bad_extend_mode_is_one_clear_line_before_loading(model_dir):
    r = _run([sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir],
             {"SGLANG_EXT_KV_EXTEND_NEW_TOKENS": "fp32"})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["sglang-ext: error: SGLANG_EXT_KV_EXTEND_NEW_TOKENS='fp32': expected one of ('full', 'pool')"], \
        r.stderr[-2000:]


def test_a_hook_that_sglang_cannot_apply_stops_the_process_naming_it(probe):
    """SGLang's apply_hooks logs the failure and goes on; the plugin's check right after it exits with status 2."""
    r = probe
    assert f"Failed to apply hooks to {BROKEN_TARGET}" in r.stderr, r.stderr[-3000:]
    assert r.returncode == 2 and "SERVED WITHOUT THE HOOK" not in r.stdout, (r.returncode, r.stderr[-3000:])
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"sglang-ext: error: hook on {BROKEN_TARGET} not applied (sglang.srt.server_args.ServerArgs has "
                    f"no attribute 'renamed_in_a_later_release'). Installed SGLang {compat.SGLANG_VERSION}, "
                    f"sglang-ext supports SGLang {compat.SGLANG_VERSION}"), r.stderr[-3000:]


# --- hook_chain and hook_check on a real HookRegistry, in this process ------------------------------------------

TARGET_MODULE = "sglang_ext_test_target"


@pytest.fixture
def registry(monkeypatch):
    """SGLang's HookRegistry with its own hook table, as compat.HookRegistry; fresh hook_chain and import_patch
    state; a module `sglang_ext_test_target` whose `f(x)` records its calls."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    class Registry(HookRegistry):
        _hooks: ClassVar[dict] = defaultdict(list)
        _patched: ClassVar[set] = set()

    monkeypatch.setattr(compat, "HookRegistry", Registry)
    for name, value in (("_chains", {}), ("_versions", {}), ("_composed", {})):
        monkeypatch.setattr(hook_chain, name, value)
    for name, value in (("_after", defaultdict(list)), ("_provided", {}), ("_applied", [])):
        monkeypatch.setattr(import_patch, name, value)
    module = types.ModuleType(TARGET_MODULE)
    module.calls = []

    def f(x):
        module.calls.append("sglang")
        return x

    module.f = f
    monkeypatch.setitem(sys.modules, TARGET_MODULE, module)
    return Registry


def _as_feature(feature: str, fn):
    fn.__module__ = f"sglang_ext.{feature}.hooks"
    return fn


def test_stacked_hooks_run_in_the_declared_order_through_one_registration(registry, monkeypatch, caplog):
    module, target = sys.modules[TARGET_MODULE], f"{TARGET_MODULE}.f"
    monkeypatch.setitem(hook_chain.ORDER, target, ("spec", "ple", "kvcache"))
    calls = module.calls

    def around(original, x):
        calls.append("spec")
        return original(x + 1) * 10

    def before(x):
        calls.append("ple")
        return (x * 2,), {}

    def after(result, x):
        calls.append("kvcache")
        return result + 5

    # Registered in another order than declared: the order is ORDER's, not the registration's.
    for feature, fn, hook_type in (("kvcache", after, "AFTER"), ("spec", around, "AROUND"), ("ple", before, "BEFORE")):
        hook_chain.register(target, _as_feature(feature, fn), getattr(compat.HookType, hook_type))
    hook_chain.register(target, around, compat.HookType.AROUND)  # the same hook again: no-op
    with caplog.at_level(logging.WARNING, logger="sglang.srt.plugins.hook_registry"):
        registry.apply_hooks()
    assert [r.getMessage() for r in caplog.records] == []
    assert len(registry._hooks[target]) == 1
    assert [h.feature for h in hook_chain.chain(target)] == ["spec", "ple", "kvcache"]
    # spec: 1 -> 2; ple: 2 -> 4; SGLang returns 4; kvcache: 4 + 5; spec: 9 * 10.
    assert module.f(1) == 90
    assert calls == ["spec", "ple", "sglang", "kvcache"]


def test_a_second_feature_on_a_target_without_a_declared_order_is_refused(registry):
    target = f"{TARGET_MODULE}.f"
    hook_chain.register(target, _as_feature("spec", lambda original, x: original(x)), compat.HookType.AROUND)
    with pytest.raises(hook_chain.HookOrderError, match=f"hooks on {target} from spec, ple: .* does not place spec, ple"):
        hook_chain.register(target, _as_feature("ple", lambda original, x: original(x)), compat.HookType.AROUND)


def test_check_names_a_hook_sglang_could_not_apply(registry):
    keep = _as_feature("kvcache", lambda result, x: None)
    hook_chain.register(f"{TARGET_MODULE}.f", keep, compat.HookType.AFTER)
    registry.apply_hooks()
    assert hook_check.verify() == hook_check.HookCheck(hook_targets=1, import_patches=0)
    hook_chain.register(f"{TARGET_MODULE}.renamed", keep, compat.HookType.AFTER)
    registry.apply_hooks()  # SGLang logs the AttributeError and goes on
    with pytest.raises(hook_check.HookCheckError) as failure:
        hook_check.verify()
    assert str(failure.value) == (
        f"hook on {TARGET_MODULE}.renamed not applied ({TARGET_MODULE} has no attribute 'renamed'). Installed SGLang "
        f"{compat.installed_sglang_version()}, sglang-ext supports SGLang {compat.SGLANG_VERSION}")


def test_check_names_an_import_time_patch_that_cannot_take(registry, monkeypatch):
    import_patch.after_import("sglang.srt.models.no_such_model", lambda module: None)
    assert hook_check.problems()[0] == ["import-time patch of sglang.srt.models.no_such_model: no such module"]
    import_patch._after.clear()
    import_patch.after_import("sglang.srt.models.gemma3n_causal", lambda module: None)  # exists: patched on import
    failures, check = hook_check.problems()
    assert failures == [] and check.import_patches == 1
    # Imported past the import hook (the patch is still waiting although the module is loaded).
    import_patch._after[TARGET_MODULE].append(lambda module: None)
    assert hook_check.problems()[0][-1] == (f"import-time patch of {TARGET_MODULE} did not run (imported past "
                                            "sglang-ext's import hook)")
    import_patch._after.clear()
    import_patch._provided["sglang.kernels.ops.speculative.renamed_tree"] = lambda module: None
    assert hook_check.problems()[0] == [("module sglang.kernels.ops.speculative.renamed_tree (provided by "
                                         "sglang-ext): no such module in SGLang")]


def test_hybrid_float32_is_refused_on_the_gpu_platform_only(tmp_path, monkeypatch):
    from sglang_ext import platform, startup_checks

    hybrid, dense = tmp_path / "hybrid", tmp_path / "dense"
    hybrid.mkdir(), dense.mkdir()
    (hybrid / "config.json").write_text(json.dumps(
        {"text_config": {"layer_types": ["linear_attention", "full_attention"]}}))
    (dense / "config.json").write_text(json.dumps({"model_type": "llama"}))
    args = types.SimpleNamespace(model_path=str(hybrid), dtype="float32")
    monkeypatch.setattr(platform, "gpu_platform_active", lambda: False)
    startup_checks.check_hybrid_dtype(args)  # the CPU platform runs it in float32 (torch ops)
    monkeypatch.setattr(platform, "gpu_platform_active", lambda: True)
    for ok in (types.SimpleNamespace(model_path=str(hybrid), dtype="bfloat16"),
               types.SimpleNamespace(model_path=str(dense), dtype="float32")):
        startup_checks.check_hybrid_dtype(ok)
    with pytest.raises(SystemExit) as exc:
        startup_checks.check_hybrid_dtype(args)
    assert exc.value.code == 2 and "use --dtype bfloat16" in exc.value.message
