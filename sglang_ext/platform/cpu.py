"""PortableCpuPlatform: stock SGLang on any x86-64 / arm64 CPU, without AMX and without sgl_kernel's CPU build.

It registers as an out-of-tree platform (PlatformEnum.OOT), which makes every fused op take its
`forward_native` torch path, while keeping SGLang's CPU device operations (psutil memory, gloo).
"""

import logging
import os

from sglang_ext import compat
from sglang_ext.env import CPU_THREADS_BIND
from sglang_ext.platform.memory import default_kv_budget_bytes, mem_fraction_for_budget, weight_bytes_estimate
from sglang_ext.platform.triton_interpreter import check_triton_interpreted

logger = logging.getLogger(__name__)


class PortableCpuPlatform(compat.CpuDeviceMixin, compat.SRTPlatform):
    _enum = compat.PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    # SGLang core takes its torch paths (allocator, req-to-token writers), no graphs, no HiCache device kernels.
    # `--attention-backend triton` still launches Triton kernels: under TRITON_INTERPRET=1 they run on CPU tensors
    # (slow; for testing the GPU attention path, tests/kvcache/test_triton_server.py).
    capabilities = compat.PlatformCapabilities()

    def apply_server_args_defaults(self, server_args) -> None:
        """Fill defaults the user left unset; `server_args` records our writes as platform defaults."""
        server_args.device = "cpu"
        # SGLang's CPU rule (run before this) picks intel_amx on x86; without AMX it falls back to torch_native only
        # after --enable-deterministic-inference has checked the backend, so resolve it here.
        if server_args.attention_backend in (None, "intel_amx"):
            server_args.attention_backend = "torch_native"
        check_triton_interpreted(server_args)
        if server_args.sampling_backend is None:
            server_args.sampling_backend = "pytorch"
        server_args.disable_cuda_graph = True
        # An idle scheduler otherwise polls at full speed: on a 2-core machine that is half the CPU.
        server_args.sleep_on_idle = True
        if server_args.mem_fraction_static is None and server_args.max_total_tokens is None:
            budget = default_kv_budget_bytes()
            weights = weight_bytes_estimate(server_args.model_path, server_args.dtype)
            server_args.mem_fraction_static = mem_fraction_for_budget(budget, weights)
        ranks = (server_args.tp_size or 1) * (server_args.pp_size or 1) * (server_args.dp_size or 1)
        if ranks > 1 and not os.environ.get(CPU_THREADS_BIND):
            # SGLang binds one NUMA node per rank unless told otherwise, and refuses more ranks than nodes.
            # Scheduler processes are spawned after this and inherit the environment.
            os.environ[CPU_THREADS_BIND] = cpu_binding_for_ranks(ranks)

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_device(self, device_id: int = 0) -> str:
        # SGLang's utils.get_device() hands this value to server args, which treat it as a string ("cpu").
        return "cpu"

    def is_pin_memory_available(self, device=None) -> bool:
        return False

    # Hybrid models' Mamba radix cache with recurrent-state snapshots (`extra_buffer`, SGLang's choice on GPUs and the
    # one that takes page sizes above 1): the snapshot copies run as torch ops here (platform/mamba_snapshots.py).
    def support_mamba_cache_extra_buffer(self) -> bool:
        return True

    # Speculative decoding: the torch ops of sglang_ext/spec are installed by its register() (plugin).
    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        from sglang_ext.spec import SUPPORTED_ALGORITHMS

        return algorithm.upper() in SUPPORTED_ALGORITHMS

    def get_speculative_cache_locs_fn(self):
        from sglang_ext.spec.adapters import assign_extend_cache_locs_func

        return assign_extend_cache_locs_func


def cpu_binding_for_ranks(ranks: int) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND value giving each rank a contiguous share of this process's CPUs
    ("0-7|8-15"); with more ranks than CPUs, ranks share CPUs round-robin ("0|1|0")."""
    cpus = sorted(os.sched_getaffinity(0))
    if ranks >= len(cpus):
        return "|".join(str(cpus[r % len(cpus)]) for r in range(ranks))
    per_rank = len(cpus) // ranks
    groups = [cpus[r * per_rank:(r + 1) * per_rank] for r in range(ranks)]
    return "|".join(",".join(map(str, g)) for g in groups)
