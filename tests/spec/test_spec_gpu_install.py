"""Which speculative-decoding ops sglang-ext installs on CUDA / HIP, and that what it installs is wired to the Triton
kernels with SGLang's call signatures. Runs on a CPU: the plan is pure, the install is recorded by fakes, SGLang's
targets are checked in its source (without importing it), the adapters run under TRITON_INTERPRET=1.
"""

import ast
import importlib.util
import random
from pathlib import Path

import pytest
import torch

from sglang_ext import compat, env
from sglang_ext.kernels import spec_sampling, spec_tree
from sglang_ext.spec import adapters, gpu_plan, hooks, tree_ops, verify_ops

ALL = {"build_tree", "reconstruct", "verify_greedy", "tree_sampling", "renorm"}
LIFT = gpu_plan.LIFT_HIP_GREEDY


@pytest.mark.parametrize("platform,mode,flashinfer,expected", [
    ("hip", "auto", True, {"tree_sampling", LIFT}),
    ("hip", "auto", False, {"tree_sampling", LIFT}),
    ("cuda", "auto", True, set()),
    ("cuda", "auto", False, {"tree_sampling", "renorm"}),
    ("hip", "all", True, ALL | {LIFT}),
    ("cuda", "all", True, ALL),
    ("cuda", "all", False, ALL),
    ("hip", "off", False, set()),
    ("cuda", "off", False, set()),
])
def test_plan(platform, mode, flashinfer, expected):
    chosen = gpu_plan.plan(platform, mode, flashinfer)
    assert set(chosen) == expected
    assert all(chosen[op] == ("torch" if op == "renorm" else "triton") for op in chosen if op != LIFT)


def test_plan_rejects_unknown_values():
    with pytest.raises(ValueError, match="auto, all, off"):
        gpu_plan.plan("cuda", "on", True)
    with pytest.raises(ValueError, match="cuda, hip"):
        gpu_plan.plan("xpu", "auto", True)


class FakeRegistry:
    def __init__(self):
        self.hooks = {}

    def register(self, target, fn, hook_type):
        # Op replacements; the draft-backend factory is the one AROUND hook
        want = compat.HookType.AROUND if target == compat.HOOK_DRAFT_BACKEND_FACTORY_CREATE else compat.HookType.REPLACE
        assert hook_type == want
        assert target not in self.hooks
        self.hooks[target] = fn


class FakePatcher:
    def __init__(self):
        self.calls = []

    def __call__(self, module_name, fn):
        self.calls.append((module_name, fn))


def _sglang_source(module_name: str) -> ast.Module:
    root = Path(importlib.util.find_spec("sglang").origin).parent
    path = root.joinpath(*module_name.split(".")[1:]).with_suffix(".py")
    return ast.parse(path.read_text())


def _defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def _assert_target_exists(target: str):
    module_name, attr = target.rsplit(".", 1)
    assert attr in _defined_names(_sglang_source(module_name)), f"{target} is not defined in SGLang 0.5.23"


EXPECTED_HOOKS = {
    "build_tree": compat.HOOK_SPEC_BUILD_TREE,
    "reconstruct": compat.HOOK_SPEC_RECONSTRUCT_TREE,
    "verify_greedy": compat.HOOK_SPEC_VERIFY_TREE_GREEDY,
    LIFT: compat.HOOK_SPEC_VERIFY_USES_GREEDY,
}


@pytest.mark.parametrize("platform,mode,flashinfer", [("hip", "auto", True), ("cuda", "auto", False),
                                                      ("cuda", "all", True), ("hip", "all", True)])
def test_install_registers_the_planned_hooks_and_patches(platform, mode, flashinfer):
    chosen = gpu_plan.plan(platform, mode, flashinfer)
    registry, patcher = FakeRegistry(), FakePatcher()
    installed = hooks.install_gpu(chosen, registry=registry, patch=patcher)
    assert installed.ops.name == "triton"
    assert installed.ops.verify_tree_greedy is spec_tree.verify_tree_greedy
    assert installed.ops.build_tree_efficient is spec_tree.build_tree_efficient
    assert installed.ops.reconstruct_indices_from_tree_mask is spec_tree.reconstruct_indices_from_tree_mask
    assert installed.ops.tree_speculative_sampling_target_only is spec_sampling.tree_speculative_sampling_target_only
    assert set(registry.hooks) == {EXPECTED_HOOKS[op] for op in chosen if op in EXPECTED_HOOKS}
    for target, fn in registry.hooks.items():
        _assert_target_exists(target)
        if target == compat.HOOK_SPEC_VERIFY_USES_GREEDY:
            assert fn is adapters.verify_uses_greedy
        else:
            assert fn.__self__ is installed and fn.__name__ == target.rsplit(".", 1)[1]
    patched = {name for name, _ in patcher.calls}
    expected_modules = set()
    if "tree_sampling" in chosen:
        expected_modules |= set(compat.SPEC_VERIFY_SAMPLING_ATTRS)
    if "renorm" in chosen:
        expected_modules |= set(compat.SPEC_RENORM_ATTRS)
    if expected_modules:
        expected_modules |= set(compat.SPEC_NONE_ATTR_IMPORTERS)
    assert patched == expected_modules
    for module_name, names in {**compat.SPEC_VERIFY_SAMPLING_ATTRS, **compat.SPEC_RENORM_ATTRS}.items():
        if module_name in patched:
            for name in names:
                _assert_target_exists(f"{module_name}.{name}")


def test_install_of_nothing_registers_nothing():
    registry, patcher = FakeRegistry(), FakePatcher()
    assert hooks.install_gpu({}, registry=registry, patch=patcher) is None
    assert registry.hooks == {} and patcher.calls == []


def test_attribute_patch_replaces_sglangs_op_where_bound():
    """CUDA: the modules hold the JIT op / FlashInfer's (not None); HIP: None. Either way the source modules and the
    importers that bind a name end up with ours; an importer that does not bind it is left alone."""
    import types

    patcher = FakePatcher()
    installed = hooks.install_gpu({"tree_sampling": "triton", "renorm": "torch"}, registry=FakeRegistry(),
                                  patch=patcher)
    sglang_op = object()
    (sampling_module, sampling_names), = compat.SPEC_VERIFY_SAMPLING_ATTRS.items()
    (renorm_module, renorm_names), = compat.SPEC_RENORM_ATTRS.items()
    binds_all, binds_none = compat.SPEC_NONE_ATTR_IMPORTERS
    modules = {name: types.ModuleType(name) for name in (sampling_module, renorm_module, binds_all, binds_none)}
    modules[sampling_module].tree_speculative_sampling_target_only = sglang_op
    modules[renorm_module].top_k_renorm_prob = None
    modules[renorm_module].top_p_renorm_prob = sglang_op
    for name in sampling_names + renorm_names:
        setattr(modules[binds_all], name, sglang_op)
    for module_name, fill in patcher.calls:
        fill(modules[module_name])
    fns = installed.functions
    for name in sampling_names:
        assert modules[sampling_module].__dict__[name] is fns[name]
        assert not hasattr(modules[renorm_module], name)
    for name in renorm_names:
        assert modules[renorm_module].__dict__[name] is fns[name]
        assert not hasattr(modules[sampling_module], name)
    for name in sampling_names + renorm_names:
        assert getattr(modules[binds_all], name) is fns[name]
        assert not hasattr(modules[binds_none], name)


def test_register_reads_the_env_switch(monkeypatch):
    """register() on a GPU host: the platform and SGLANG_EXT_SPEC_GPU_OPS pick the plan; 'off' installs nothing."""
    for mode, platform, want_hooks in (("off", "hip", set()), ("all", "cuda", {EXPECTED_HOOKS[o] for o in
                                                                             ("build_tree", "reconstruct",
                                                                              "verify_greedy")}),
                                       ("auto", "hip", {compat.HOOK_SPEC_VERIFY_USES_GREEDY})):
        registry, patcher = FakeRegistry(), FakePatcher()
        monkeypatch.setattr(hooks, "_registered", False)
        monkeypatch.setattr(hooks, "cpu_platform_active", lambda: False)
        monkeypatch.setattr(hooks, "gpu_platform", lambda p=platform: p)
        monkeypatch.setattr(hooks, "hook_chain", registry)  # what register() registers through
        monkeypatch.setattr(hooks, "after_import", patcher)
        monkeypatch.setenv(env.SPEC_GPU_OPS, mode)
        lines = hooks.register()
        # The compressed-KV draft backends are registered whatever the ops plan says.
        assert set(registry.hooks) == want_hooks | {compat.HOOK_DRAFT_BACKEND_FACTORY_CREATE}
        assert lines[-1] == "draft attention over compressed KV (triton)"
        assert len(lines) == (1 if mode == "off" else 2)
        if mode == "auto":
            assert "tree_sampling (triton)" in lines[0] and platform in lines[0]


def _sglang_verify_uses_greedy():
    """SGLang's own predicate, compiled from its source (importing eagle_utils pulls in most of SGLang)."""
    tree = _sglang_source("sglang.srt.speculative.eagle_utils")
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_verify_uses_greedy")
    namespace = {}
    exec(compile(ast.Module([fn], []), "eagle_utils", "exec"), namespace)
    return fn, namespace["_verify_uses_greedy"]


def test_verify_uses_greedy_lifts_only_the_hip_clause():
    import inspect
    import itertools

    fn_node, theirs = _sglang_verify_uses_greedy()
    assert [a.arg for a in fn_node.args.kwonlyargs] == list(inspect.signature(adapters.verify_uses_greedy).parameters)
    differs = []
    for values in itertools.product((False, True), repeat=5):
        kw = dict(zip(("is_all_greedy", "is_cpu", "is_hip", "is_xpu", "use_rejection_sampling"), values))
        if theirs(**kw) != adapters.verify_uses_greedy(**kw):
            differs.append(kw)
    # only HIP, non-greedy batch, no rejection sampling, not CPU/XPU: SGLang goes greedy, we sample
    assert differs == [dict(is_all_greedy=False, is_cpu=False, is_hip=True, is_xpu=False,
                            use_rejection_sampling=False)]


def _links(bs, n, rng):
    masks = []
    for _ in range(bs):
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        m = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j != -1:
                m[i, j] = True
                j = parents[j]
        masks.append(m)
    mask = torch.stack(masks).flatten()
    out = torch.empty((4, bs, n), dtype=torch.int64)
    tree_ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs, dtype=torch.long), out[0].view(-1), out[1],
                                                out[2], out[3], bs, n)
    return mask, out[1], out[2], out[3]


def test_installed_adapters_run_the_triton_kernels_as_sglang_calls_them():
    """Called with the keyword names eagle_sample / ngram_worker / build_tree use, the Triton-backed adapters give
    the torch ops' outputs (interpreter)."""
    rng = random.Random(0)
    torch.manual_seed(0)
    fns = adapters.SpecAdapters(adapters.triton_ops()).functions
    bs, n, vocab = 3, 4, 40
    mask, ridx, nxt, sib = _links(bs, n, rng)
    cand = torch.randint(0, 3, (bs, n))
    target = torch.randint(0, 3, (bs, n))

    def bufs():
        return (torch.zeros(bs * n, dtype=torch.int32), torch.full((bs, n), -1, dtype=torch.int32),
                torch.zeros(bs, dtype=torch.int32))
    want, got = bufs(), bufs()
    verify_ops.verify_tree_greedy(*want, cand, ridx, nxt, sib, target)
    out = fns["verify_tree_greedy_func"](predicts=got[0], accept_index=got[1], accept_token_num=got[2],
                                         candidates=cand, retrieve_index=ridx, retrieve_next_token=nxt,
                                         retrieve_next_sibling=sib, target_predict=target, topk=1)
    assert all(torch.equal(a, b) for a, b in zip(out, want))

    logits = torch.randn(bs, n, vocab)
    logits[:, :, :3] += 5
    probs = torch.softmax(logits, -1)
    coins, final = torch.rand(bs, n), torch.rand(bs)
    want, got = bufs(), bufs()
    verify_ops.tree_speculative_sampling_target_only(*want, cand, ridx, nxt, sib, coins, final, probs.clone(),
                                                     torch.zeros_like(probs))
    fns["tree_speculative_sampling_target_only"](
        predicts=got[0], accept_index=got[1], accept_token_num=got[2], candidates=cand, retrive_index=ridx,
        retrive_next_token=nxt, retrive_next_sibling=sib, uniform_samples=coins,
        uniform_samples_for_final_sampling=final, target_probs=probs.clone(), draft_probs=torch.zeros_like(probs),
        threshold_single=1.0, threshold_acc=1.0, deterministic=True)
    assert int(want[2].sum()) > 0
    assert all(torch.equal(a, b) for a, b in zip(got, want))

    seq = torch.tensor([5, 9, 2])
    want_r = [torch.full((bs, n), -9, dtype=torch.int64) for _ in range(4)]
    got_r = [t.clone() for t in want_r]
    tree_ops.reconstruct_indices_from_tree_mask(mask, seq, want_r[0].view(-1), *want_r[1:], bs, n)
    fns[compat.SPEC_RECONSTRUCT_TREE_FN](tree_mask=mask, verified_seq_len=seq, positions=got_r[0].view(-1),
                                         retrieve_index=got_r[1], retrieve_next_token=got_r[2],
                                         retrieve_next_sibling=got_r[3], batch_size=bs, draft_token_num=n)
    assert all(torch.equal(a, b) for a, b in zip(got_r, want_r))

    topk, depth, nv = 2, 3, 4
    plist = torch.tensor([[-1, 0, 1, 3, 4]] * bs)
    sel = torch.tensor([[0, 1, 3]] * bs)
    outs = []
    for build in (lambda *a: tree_ops.build_tree_efficient(*a, topk, depth, nv, True),
                  lambda *a: fns["build_tree_kernel_efficient_func"](*a, topk, depth, nv, compat.SPEC_TREE_MASK_FULL)):
        mask_out = torch.ones(int(seq.sum()) * nv + nv * nv * bs, dtype=torch.bool)
        pos = torch.empty(bs * nv, dtype=torch.int64)
        links = torch.full((3, bs, nv), -1, dtype=torch.int64)
        build(plist, sel, seq, mask_out, pos, links[0], links[1], links[2])
        outs.append((mask_out, pos, links))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    with pytest.raises(NotImplementedError, match="triton"):
        fns["build_tree_kernel_efficient_func"](plist, sel, seq, mask_out, pos, links[0], links[1], links[2], topk,
                                                depth, nv, 2)


class _FakeMultiStep:
    def __init__(self, runner, topk, num_steps):
        self.runner, self.topk, self.num_steps = runner, topk, num_steps
        self.kv_indptr = [f"indptr-row-{i}" for i in range(num_steps)]
        self.attn_backends = ["sglang TritonAttnBackend"] * (num_steps - 1)


class _FakeCompressedTriton:
    def __init__(self, runner, skip_prefill, kv_indptr_buf=None):
        self.runner, self.skip_prefill, self.kv_indptr_buf = runner, skip_prefill, kv_indptr_buf


def test_compressed_triton_draft_wiring(monkeypatch):
    """Over a compressed draft pool the factory's `triton` entries build our backends (decode: SGLang's multi-step
    container with our per-step backends, each on its step's kv_indptr row; extend: ours), other entries refuse
    by name, and a dense pool goes to SGLang untouched."""
    import types

    import torch

    from sglang_ext.kvcache import triton_backend
    from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
    from sglang_ext.spec import draft_backends

    monkeypatch.setattr(compat, "TritonMultiStepDraftBackend", _FakeMultiStep, raising=False)
    monkeypatch.setattr(triton_backend, "CompressedTritonAttnBackend", _FakeCompressedTriton)
    pool = CompressedMHATokenToKVPool.__new__(CompressedMHATokenToKVPool)
    pool.kv_format = types.SimpleNamespace(name="octave_k3v4")
    runner = types.SimpleNamespace(token_to_kv_pool=pool)
    factory = types.SimpleNamespace(draft_model_runner=runner, topk=2, speculative_num_steps=3)
    sglang_map = {"triton": lambda: ("triton", "sglang dense"), "flashinfer": lambda: ("flashinfer", "sglang fi")}

    def original(factory, backend_name, backend_map, error_template, stamps_children=False):
        return backend_map[chosen]()[1]  # SGLang calls the entry of the configured backend

    chosen = "triton"
    multi = draft_backends.compressed_triton_draft(original, factory, "decode_attention_backend", sglang_map, "")
    assert isinstance(multi, _FakeMultiStep) and (multi.topk, multi.num_steps) == (2, 3)
    assert [type(b) for b in multi.attn_backends] == [_FakeCompressedTriton] * 2
    assert [b.kv_indptr_buf for b in multi.attn_backends] == ["indptr-row-0", "indptr-row-1"]
    assert all(b.skip_prefill for b in multi.attn_backends)
    extend = draft_backends.compressed_triton_draft(original, factory, "draft_extend_attention_backend", sglang_map, "")
    assert isinstance(extend, _FakeCompressedTriton) and not extend.skip_prefill
    chosen = "flashinfer"
    with pytest.raises(ValueError, match="octave_k3v4: draft attention backend 'flashinfer' cannot read"):
        draft_backends.compressed_triton_draft(original, factory, "decode_attention_backend", sglang_map, "")
    dense = types.SimpleNamespace(draft_model_runner=types.SimpleNamespace(token_to_kv_pool=torch.zeros(1)))
    chosen = "triton"
    assert draft_backends.compressed_triton_draft(original, dense, "decode_attention_backend", sglang_map, "") \
        == "sglang dense"
