"""SGLang's paged experts (`--enable-paged-experts --paged-experts-num-resident K`) on the portable CPU platform,
and an optional routing/residency trace on any platform.

SGLang's implementation (host store, LRU residency, wave executor, runner contract) runs unchanged; on the CPU
platform three of its CUDA-only pieces are swapped through hooks:

- the host store is allocated pageable: the platform has no page-locked memory (`is_pin_memory_available` is
  False), and its "device" slot table is host memory too;
- waves run the torch routed-expert compute (`expert_ops.routed_expert_entries`) instead of the triton runner,
  which on CPU tensors only runs under the Triton interpreter;
- the runner contract's top-k sum is a torch sum (SGLang's falls back to a Triton kernel off CUDA/HIP/XPU).

Only unquantized experts have a torch compute: any other paged format is refused on this platform with one line.

With `SGLANG_EXT_PAGED_EXPERTS_TRACE=<file>` every process appends JSON lines: one per MoE layer when its store
is built (`{"store": layer_id, "table": n, "experts": E, "slots": K, "host_bytes": ..., "slot_bytes": ...}`) and one
per planned step (`{"layer": layer_id, "table": n, "experts": [distinct routed ids], "loads": [[expert, slot], ...]}`;
`table` numbers the process's slot tables in build order, since a draft's MTP layer may share a target layer's id): the
server's own hit/miss record, which the tests replay through `residency.LruResidency`.
"""

from __future__ import annotations

import json
import os
import threading

from sglang_ext import compat, hook_chain
from sglang_ext.env import PAGED_EXPERTS_TRACE
from sglang_ext.moe.expert_ops import routed_expert_entries, sum_top_k
from sglang_ext.platform import cpu_platform_active

_registered = False


class TorchExpertsRunner:
    """What paged experts' executors run waves through on the CPU platform: `apply` returns the router-weighted
    [tokens, top_k, hidden] entries over the layer's K-slot table, as the triton runner does under
    `runners.runner_config`."""

    def __init__(self, base_method):
        self.base_method = base_method

    @property
    def runner(self):  # TritonContract.run_wave reads the runner's config
        return self.base_method.runner

    def apply(self, layer, dispatch_output):
        config = self.base_method.moe_runner_config
        if config.activation != "silu" or config.apply_router_weight_on_input or config.gemm1_alpha is not None:
            raise RuntimeError("Paged experts on the cpu platform: SiLU-gated experts with router weights on the "
                               f"output only; this layer has activation={config.activation!r}, "
                               f"apply_router_weight_on_input={config.apply_router_weight_on_input}")
        topk = dispatch_output.topk_output
        entries = routed_expert_entries(dispatch_output.hidden_states, layer.w13_weight.data, layer.w2_weight.data,
                                        topk.topk_ids, topk.topk_weights)
        return compat.StandardCombineInput(hidden_states=entries)


def _torch_contract():
    class TorchSumContract(compat.PagedTritonContract):
        """SGLang's triton contract (wave merge by slot mask) with the top-k sum in torch."""

        def _sum_top_k(self, entries, out, routed_scaling_factor: float) -> None:
            sum_top_k(entries, out, routed_scaling_factor)

    return TorchSumContract()


_TORCH_CONTRACT = None


def _store_init(original, self, layer, names, num_experts, pin=True):
    original(self, layer, names, num_experts, pin=False)


def _contract_for(original, runner):
    global _TORCH_CONTRACT
    contract = original(runner)
    if isinstance(contract, compat.PagedTritonContract):
        _TORCH_CONTRACT = _TORCH_CONTRACT or _torch_contract()
        return _TORCH_CONTRACT
    return contract


def _unquantized_runner_method(original, self, base_method):
    runner = original(self, base_method)
    return TorchExpertsRunner(runner) if isinstance(self, compat.PagedUnquantizedFormat) else runner


def _make_for_layer(original, layer, base_method):
    method = original(layer=layer, base_method=base_method)
    if not isinstance(method.format, compat.PagedUnquantizedFormat):
        raise RuntimeError(  # noqa: TRY004 (a refusal of the configuration, like SGLang's own)f"Paged experts on the cpu platform: only unquantized (float32/bfloat16/float16) experts "
                           f"have a torch compute; this layer's experts are {method.format.label}")
    return method


# --- what SGLang refuses and sglang-ext lifts --------------------------------------------------------------------
def _check_compat(original, layer, expert_format):
    """SGLang's check, minus the refusals listed in compat.PAGED_LIFTED_REFUSALS (each lifted only with a server
    test proving equal output); what remains is raised with what paged experts does support.

    Lifted: --tp-size > 1. Each rank builds its own host store through SGLang's per-expert loader, which shards as
    without paging; every rank routes the same replicated hidden states with the same router weights, so every
    rank's LRU places and loads the same experts with no collective of its own (tests/moe/test_paged_tp.py checks
    the two ranks' traces are identical); the layer's usual all-reduce sums the ranks' partial outputs.
    Lifted: --pp-size > 1. A stage creates only its own layers (SGLang's make_layers), so each stage builds host
    stores, slot tables and LRU state for its layers alone and pages them between its own forward passes; nothing
    of paging crosses a stage boundary (tests/moe/test_paged_pp.py: each stage's trace holds only its layers).
    Lifted: speculative decoding with NEXTN/MTP (SGLang runs it as EAGLE). A verify batch routes (draft tokens + 1)
    x top-k entries per request through the same wave planner as a prefill; the draft's own MoE layer (the MTP
    layer) is a FusedMoE of the draft worker and pages its own store like any other layer."""
    try:
        original(layer=layer, expert_format=expert_format)
    except RuntimeError as exc:
        text = str(exc)
        if not text.startswith(compat.PAGED_REFUSAL_PREFIX):
            raise
        problems = text[len(compat.PAGED_REFUSAL_PREFIX):].split("; ")
        lifted = compat.PAGED_LIFTED_REFUSALS
        if str(compat.get_spec().speculative_algorithm).upper() in compat.PAGED_SPEC_ALGORITHMS:
            lifted = (*lifted, compat.PAGED_SPEC_REFUSAL)
        left = [p for p in problems if p not in lifted]
        if left:
            raise RuntimeError(compat.PAGED_REFUSAL_PREFIX + "; ".join(left) + f" ({SUPPORTED})") from None


SUPPORTED = ("supported: one GPU, --tp-size N (each rank pages its own shard of every expert) and --pp-size N (each "
             "stage pages its own layers), also on the cpu platform; the expert formats SGLang lists, triton or Marlin "
             "runner; speculative decoding with NEXTN/MTP (EAGLE); --ep-size, --dp-size > 1 and other speculative "
             "algorithms are not")


# --- trace ---------------------------------------------------------------------------------------------------
_trace_lock = threading.Lock()
_layer_of_policy: dict[int, tuple[int, int]] = {}  # id(policy) -> (layer id, table: the store's build order)


def _write(record: dict) -> None:
    record["pid"] = os.getpid()  # one scheduler process per rank
    with _trace_lock, open(os.environ[PAGED_EXPERTS_TRACE], "a") as f:
        f.write(json.dumps(record) + "\n")


def _record_store(result, self, layer):
    table = len(_layer_of_policy)  # a draft model's MoE layer (an MTP layer) may repeat a target layer's id
    _layer_of_policy[id(self.policy)] = (int(layer.layer_id), table)
    _write({"store": int(layer.layer_id), "table": table, "experts": self.num_experts, "slots": self.num_resident,
            "host_bytes": sum(t.nbytes for t in self.store.host.values()),
            "slot_bytes": sum(getattr(layer, name).data.nbytes for name in self.store.host)})


def _record_waves(waves, *args, **kwargs):
    policy = kwargs["policy"] if "policy" in kwargs else args[0]
    distinct = kwargs["distinct"] if "distinct" in kwargs else args[1]
    layer, table = _layer_of_policy.get(id(policy), (-1, -1))
    _write({"layer": layer, "table": table, "experts": list(distinct),
            "loads": [list(load) for wave in waves for load in wave.loads]})


def register() -> list[str]:
    global _registered
    if _registered:
        return []
    _registered = True
    done = []
    if cpu_platform_active():
        hook_chain.register(compat.HOOK_PAGED_STORE_INIT, _store_init, compat.HookType.AROUND)
        hook_chain.register(compat.HOOK_PAGED_CONTRACT_FOR, _contract_for, compat.HookType.AROUND)
        hook_chain.register(compat.HOOK_PAGED_UNQUANT_RUNNER_METHOD, _unquantized_runner_method,
                            compat.HookType.AROUND)
        hook_chain.register(compat.HOOK_PAGED_MAKE_FOR_LAYER, _make_for_layer, compat.HookType.AROUND)
        done.append("paged experts (torch, pageable store) on the cpu platform")
    hook_chain.register(compat.HOOK_PAGED_CHECK_COMPAT, _check_compat, compat.HookType.AROUND)
    done.append("paged experts with --tp-size, --pp-size, NEXTN")
    if os.environ.get(PAGED_EXPERTS_TRACE):
        hook_chain.register(compat.HOOK_PAGED_AFTER_LOADING, _record_store, compat.HookType.AFTER)
        hook_chain.register(compat.HOOK_PAGED_PLAN_WAVES, _record_waves, compat.HookType.AFTER)
        done.append(f"paged-experts trace to {os.environ[PAGED_EXPERTS_TRACE]}")
    return done
