"""A CUDA or HIP SGLang process on this CPU, for the GPU speculative-op install (run by test_spec_gpu_process.py).

    python tests/spec/gpu_process_ops.py {cuda|hip}    (SGLANG_EXT_SPEC_GPU_OPS in the environment; TRITON_INTERPRET=1)

Only torch's device queries are faked (`torch.cuda.is_available`, device name / capability / properties, and
`torch.version.hip` / `.cuda` for a ROCm build). SGLang modules that load sgl_kernel's CUDA build at import (it
needs libcuda) are imported first, as on this CPU; every module on the speculative path is imported after the fake,
so its platform branches are those of a GPU process (`_is_cuda` / `_is_hip`, the JIT ops bound on CUDA, None or
SGLang's Triton renorm on HIP). Then SGLang's own `load_plugins()` loads sglang-ext from its entry point and applies
the hooks, and SGLang's real EAGLE / NGRAM helpers run on CPU tensors (Triton kernels under the interpreter):

  build_tree      eagle_utils.build_tree_kernel_efficient     vs SGLang's Triton tree build (its XPU path)
  verify_greedy   eagle_utils.eagle_sample, greedy batch       vs SGLang's Triton greedy verify (its XPU path)
  tree_sampling   eagle_utils.eagle_sample, top-k sampling     vs the torch ops (verify_ops: the spec), same coins
  DFlash          dflash_utils binds the same ops and sees sampling verify available where tree sampling is ours
  reconstruct     reconstruct_tree.reconstruct_indices_from_tree_mask_func (what ngram_worker imports; importing the
                  worker itself pulls in the scheduler and sgl_kernel) vs SGLang's Triton version (XPU path)

An op the plan leaves to SGLang is checked to still be SGLang's (a JIT op cannot run here, so it is not called).
Prints one JSON line: {"plan": ..., "checked": [...], "unpatched": [...]}; any mismatch raises.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import types

import torch

PLATFORM = sys.argv[1]
assert PLATFORM in ("cuda", "hip"), PLATFORM
assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1 (Triton kernels on CPU tensors)"

# Loaded before the fake: each imports sgl_kernel's CUDA build when it sees a GPU (needs libcuda).
import sglang.srt.mem_cache.allocation  # noqa: E402,F401
import sglang.srt.mem_cache.kv_cache_configurator  # noqa: E402,F401
import sglang.srt.mem_cache.pool_host.mha  # noqa: E402,F401
import sglang.srt.mem_cache.pool_host.unified  # noqa: E402,F401
import sglang.srt.model_executor.model_runner_components.attention_backend_setup  # noqa: E402,F401
import sglang.srt.layers.sampler  # noqa: E402,F401
import sglang.srt.utils.common as sglang_utils  # noqa: E402

SPEC_PATH = ("sglang.kernels.ops.speculative.spec_tree", "sglang.kernels.ops.speculative.verify_sampling",
             "sglang.kernels.ops.speculative.reconstruct_tree", "sglang.kernels.ops.sampling.renorm",
             "sglang.srt.speculative.eagle_utils", "sglang.srt.speculative.dflash_utils")
early = [m for m in SPEC_PATH if m in sys.modules]
assert not early, f"speculative modules imported before the device fake: {early}"

# --- the fake: torch's device queries of one H200 / MI300X -----------------------------------------------------
_name = "AMD Instinct MI300X" if PLATFORM == "hip" else "NVIDIA H200"
_cap = (9, 4) if PLATFORM == "hip" else (9, 0)
_props = types.SimpleNamespace(name=_name, major=_cap[0], minor=_cap[1], gcnArchName="gfx942:sramecc+:xnack-",
                               total_memory=141 << 30, multi_processor_count=132, warp_size=64 if PLATFORM == "hip" else 32,
                               L2_cache_size=50 << 20)
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_name = lambda device=None: _name
torch.cuda.get_device_capability = lambda device=None: _cap
torch.cuda.get_device_properties = lambda device=None: _props
if PLATFORM == "hip":
    torch.version.hip, torch.version.cuda = "6.4.0", None
for _fn_name in dir(sglang_utils):  # SGLang caches its platform predicates (lru_cache): ask them again
    _fn = getattr(sglang_utils, _fn_name)
    if _fn_name.startswith("is_") and hasattr(_fn, "cache_clear"):
        _fn.cache_clear()
assert sglang_utils.is_hip() == (PLATFORM == "hip") and sglang_utils.is_cuda() == (PLATFORM == "cuda")

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

load_plugins()

from sglang.kernels.ops.sampling import renorm, renorm_triton  # noqa: E402
from sglang.kernels.ops.speculative import reconstruct_tree, spec_tree  # noqa: E402
from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode  # noqa: E402
from sglang.srt.runtime_context import _CONTEXT, get_parallel  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402
from sglang.srt.speculative import dflash_utils, eagle_utils  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleVerifyInput  # noqa: E402

from sglang_ext import compat, env  # noqa: E402
from sglang_ext.spec import gpu_plan, hooks, tree_ops, verify_ops  # noqa: E402

assert eagle_utils._is_hip == (PLATFORM == "hip") and eagle_utils._is_cuda == (PLATFORM == "cuda")
assert not eagle_utils._is_cpu and not spec_tree._is_xpu
MODE = os.environ.get(env.SPEC_GPU_OPS, "auto")
PLAN = gpu_plan.plan(PLATFORM, MODE, flashinfer_installed=True)  # FlashInfer is installed in this environment
assert hooks.gpu_platform() == PLATFORM
checked: list[str] = []

# Every target registered in this process was patched (SGLang logs a failed one and goes on).
unpatched = sorted(t for t in HookRegistry._hooks if t not in HookRegistry._patched)
spec_targets = {compat.HOOK_SPEC_BUILD_TREE, compat.HOOK_SPEC_RECONSTRUCT_TREE, compat.HOOK_SPEC_VERIFY_TREE_GREEDY,
                compat.HOOK_SPEC_VERIFY_USES_GREEDY, compat.HOOK_DRAFT_BACKEND_FACTORY_CREATE}
assert not spec_targets & set(unpatched), f"speculative hooks not applied: {sorted(spec_targets & set(unpatched))}"


def ours(fn) -> bool:
    """True when fn is an sglang-ext function (an adapter) or HookRegistry's REPLACE wrapper that calls one."""
    if isinstance(fn, types.MethodType):
        return type(fn.__self__).__module__.startswith("sglang_ext.")
    if not isinstance(fn, types.FunctionType):
        return False  # e.g. FlashInfer's LazyImport on CUDA
    if fn.__module__.startswith("sglang_ext."):
        return True
    return any(ours(cell.cell_contents) for cell in fn.__closure__ or () if callable(cell.cell_contents)
               and cell.cell_contents is not getattr(fn, "__wrapped__", None))


def equal(name: str, got, want) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g.to(w.dtype), w), f"{PLATFORM} {MODE} {name}: output {i} differs\n got {g}\nwant {w}"


# --- bindings SGLang's callers use -------------------------------------------------------------------------------
bindings = {
    "build_tree": [(eagle_utils, "build_tree_kernel_efficient_func")],
    "verify_greedy": [(eagle_utils, "verify_tree_greedy_func")],
    "reconstruct": [(reconstruct_tree, compat.SPEC_RECONSTRUCT_TREE_FN)],
    "tree_sampling": [(eagle_utils, "tree_speculative_sampling_target_only"),
                      (dflash_utils, "tree_speculative_sampling_target_only")],
    "renorm": [(eagle_utils, "top_k_renorm_prob"), (eagle_utils, "top_p_renorm_prob"),
               (dflash_utils, "top_k_renorm_prob"), (dflash_utils, "top_p_renorm_prob")],
}
for op, where in bindings.items():
    for module, name in where:
        fn = getattr(module, name)
        if op in PLAN:
            assert ours(fn), f"{PLATFORM} {MODE}: {module.__name__}.{name} is {fn!r}, not sglang-ext's"
        else:
            assert fn is None or not ours(fn), f"{PLATFORM} {MODE}: {module.__name__}.{name} replaced, not planned"
checked.append("bindings")
lift = eagle_utils._verify_uses_greedy(is_all_greedy=False, is_cpu=False, is_hip=True, is_xpu=False,
                                       use_rejection_sampling=False)
assert lift == (gpu_plan.LIFT_HIP_GREEDY not in PLAN), f"_verify_uses_greedy on HIP, non-greedy batch: {lift}"
# DFlash decides at import whether it can verify by sampling (SGLang alone: not on HIP)
dflash_sampling = dflash_utils.is_dflash_sampling_verify_available()
assert dflash_sampling == (PLATFORM == "cuda" or "tree_sampling" in PLAN), f"DFlash sampling verify: {dflash_sampling}"

# --- a draft tree: batch of 2, topk 2, 3 steps, 4 verified tokens ----------------------------------------------
BS, TOPK, STEPS, NV, VOCAB = 2, 2, 3, 4, 48
seq_lens = torch.tensor([7, 12])
parent_list = torch.tensor([[-1, 0, 1, 3, 4]] * BS)  # SGLang's draft loop: parents of each step's topk
top_scores_index = torch.tensor([[0, 1, 3], [0, 2, 3]])
bonus = torch.tensor([5, 9])
drafts = torch.tensor([[1, 2, 3], [4, 1, 2]])

if "build_tree" in PLAN:
    for mode in (spec_tree.TreeMaskMode.FULL_MASK, spec_tree.TreeMaskMode.QLEN_ONLY):
        got = eagle_utils.build_tree_kernel_efficient(bonus, parent_list, top_scores_index, drafts, seq_lens,
                                                      int(seq_lens.sum()), TOPK, STEPS, NV, tree_mask_mode=mode)
        want_mask = got[0].clone().fill_(True)
        want_pos, want_links = torch.empty_like(got[1]), torch.full((3, BS, NV), -1, dtype=torch.long)
        spec_tree.sgl_build_tree_kernel_triton(parent_list, top_scores_index, seq_lens, want_mask, want_pos,
                                               *want_links, TOPK, STEPS, NV, mode)
        equal(f"build_tree {mode.name}", got[:5], (want_mask, want_pos, *want_links))
    checked.append("build_tree")

tree = eagle_utils.build_tree_kernel_efficient(bonus, parent_list, top_scores_index, drafts, seq_lens,
                                               int(seq_lens.sum()), TOPK, STEPS, NV) if "build_tree" in PLAN else None
if tree is None:  # SGLang's JIT tree build cannot run here: the torch op gives the same tree
    mask = torch.ones(int(seq_lens.sum()) * NV + NV * NV * BS, dtype=torch.bool)
    positions, links = torch.empty(BS * NV, dtype=torch.long), torch.full((3, BS, NV), -1, dtype=torch.long)
    tree_ops.build_tree_efficient(parent_list, top_scores_index, seq_lens, mask, positions, *links, TOPK, STEPS, NV,
                                  full_mask=True)
    tree = (mask, positions, *links, torch.cat((bonus[:, None], drafts), 1).flatten())
tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, draft_tokens = tree


def verify_input() -> EagleVerifyInput:
    return EagleVerifyInput(
        draft_token=draft_tokens, custom_mask=tree_mask, positions=positions, retrieve_index=retrieve_index,
        retrieve_next_token=retrieve_next_token, retrieve_next_sibling=retrieve_next_sibling, retrieve_cum_len=None,
        spec_steps=STEPS, topk=TOPK, draft_token_num=NV, capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens)


def sampling_info(greedy: bool, top_k: int) -> SamplingBatchInfo:
    return SamplingBatchInfo(
        temperatures=torch.full((BS, 1), 1.0), top_ps=torch.ones(BS), top_ks=torch.full((BS,), top_k, dtype=torch.int32),
        min_ps=torch.zeros(BS), is_all_greedy=greedy, is_any_greedy=greedy, need_top_p_sampling=False,
        need_top_k_sampling=top_k < VOCAB, need_min_p_sampling=False, vocab_size=VOCAB, device="cpu")


def batch(info: SamplingBatchInfo):
    # eagle_sample reads these fields of the ScheduleBatch (a real one needs a running scheduler)
    return types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=seq_lens, sampling_info=info,
                                 device="cpu", return_logprob=False, req_pool_indices=torch.arange(BS))


g = torch.Generator().manual_seed(0)
logits = torch.randn(BS * NV, VOCAB, generator=g)
# The target favours each node's first child (a draft that gets accepted), except below request 1's first draft
# (its chain stops there): accept paths of different lengths.
for b in range(BS):
    for i in range(NV):
        child = int(retrieve_next_token[b, i])
        if child >= 0 and (b, i) != (1, 1):
            logits[b * NV + i, draft_tokens[b * NV + child]] += 8.0
spec_override = _CONTEXT.override_server_args()  # SGLang's default server args (no rejection sampling)
spec_override.install()
# One rank: eagle_sample reads the TP group's size (it broadcasts the result only with more than one).
one_rank = get_parallel().override(tp_group=types.SimpleNamespace(world_size=1))
one_rank.__enter__()

if "verify_greedy" in PLAN:
    predict, accept_lens, accept_index = eagle_utils.eagle_sample(
        verify_input(), batch(sampling_info(True, 1)), LogitsProcessorOutput(next_token_logits=logits.clone()))
    want = (torch.zeros(BS * NV, dtype=torch.int32), torch.full((BS, STEPS + 1), -1, dtype=torch.int32),
            torch.empty(BS, dtype=torch.int32))
    spec_tree.verify_tree_greedy_triton(*want, draft_tokens.view(BS, NV), retrieve_index, retrieve_next_token,
                                        retrieve_next_sibling, logits.argmax(-1).view(BS, NV))
    equal("eagle_sample greedy", (predict, accept_index, accept_lens), (want[0], want[1], want[2] + 1))
    assert int(want[2].sum()) > 0, "no draft accepted: the check would not see the accept path"
    checked.append("verify_greedy")

if "tree_sampling" in PLAN:
    # SGLang's HIP renorm (Triton) refuses CPU tensors: without our renorm, sample without top-k
    top_k = 6 if "renorm" in PLAN else VOCAB
    torch.manual_seed(1)
    predict, accept_lens, accept_index = eagle_utils.eagle_sample(
        verify_input(), batch(sampling_info(False, top_k)), LogitsProcessorOutput(next_token_logits=logits.clone()))
    torch.manual_seed(1)  # the coins eagle_sample draws (torch.rand_like, then torch.rand)
    coins = torch.rand_like(draft_tokens.view(BS, NV), dtype=torch.float32)
    final = torch.rand((BS,), dtype=torch.float32)
    probs = torch.softmax(logits, -1)
    if top_k < VOCAB:
        probs = verify_ops.top_k_renorm_prob(probs, torch.full((BS * NV,), top_k))
    want = (torch.zeros(BS * NV, dtype=torch.int32), torch.full((BS, STEPS + 1), -1, dtype=torch.int32),
            torch.empty(BS, dtype=torch.int32))
    verify_ops.tree_speculative_sampling_target_only(
        *want, draft_tokens.view(BS, NV), retrieve_index, retrieve_next_token, retrieve_next_sibling, coins, final,
        probs.view(BS, NV, VOCAB), torch.zeros(BS, NV, VOCAB), 1.0, 1.0)
    equal("eagle_sample top-k sampling", (predict, accept_index, accept_lens), (want[0], want[1], want[2] + 1))
    assert int(want[2].sum()) > 0, "no draft accepted: the check would not see the accept path"
    checked.append("tree_sampling" + ("+renorm" if top_k < VOCAB else ""))
    if "renorm" not in PLAN and PLATFORM == "hip":
        assert eagle_utils.top_k_renorm_prob is renorm_triton.top_k_renorm_probs_triton
one_rank.__exit__(None, None, None)
spec_override.restore()

if "reconstruct" in PLAN:
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]] * BS, dtype=torch.bool).flatten()
    outs = []
    for fn in (reconstruct_tree.reconstruct_indices_from_tree_mask_func,
               reconstruct_tree.reconstruct_indices_from_tree_mask_triton):
        pos, links = torch.full((BS * NV,), -9, dtype=torch.long), torch.full((3, BS, NV), -9, dtype=torch.long)
        fn(mask, seq_lens, pos, *links, BS, NV)
        outs.append((pos, *links))
    equal("reconstruct", *outs)
    checked.append("reconstruct")

assert renorm.top_k_renorm_prob is not None
print(json.dumps({"plan": sorted(PLAN), "checked": checked, "unpatched": unpatched}))
