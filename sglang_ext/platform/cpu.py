"""PortableCpuPlatform: stock SGLang on any x86-64 / arm64 CPU, without AMX and without sgl_kernel's CPU build.

It registers as an out-of-tree platform (PlatformEnum.OOT), which makes every fused op take its
`forward_native` torch path, while keeping SGLang's CPU device operations (psutil memory, gloo).
"""

import logging

from sglang_ext import compat
from sglang_ext.platform.memory import default_kv_budget_bytes, mem_fraction_for_budget, weight_bytes_estimate

logger = logging.getLogger(__name__)


class PortableCpuPlatform(compat.CpuDeviceMixin, compat.SRTPlatform):
    _enum = compat.PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    capabilities = compat.PlatformCapabilities()  # no Triton launches, no graphs, no HiCache device kernels

    def apply_server_args_defaults(self, server_args) -> None:
        """Fill defaults the user left unset; `server_args` records our writes as platform defaults."""
        server_args.device = "cpu"
        if server_args.attention_backend is None:
            server_args.attention_backend = "torch_native"
        if server_args.sampling_backend is None:
            server_args.sampling_backend = "pytorch"
        server_args.disable_cuda_graph = True
        if server_args.mem_fraction_static is None and server_args.max_total_tokens is None:
            budget = default_kv_budget_bytes()
            weights = weight_bytes_estimate(server_args.model_path, server_args.dtype)
            server_args.mem_fraction_static = mem_fraction_for_budget(budget, weights)

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_device(self, device_id: int = 0) -> str:
        # SGLang's utils.get_device() hands this value to server args, which treat it as a string ("cpu").
        return "cpu"

    def is_pin_memory_available(self, device=None) -> bool:
        return False
