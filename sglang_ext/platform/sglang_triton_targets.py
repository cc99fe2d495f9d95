"""SGLang's own Triton kernels that the portable_gpu platform launches, built ahead of time for the targets of
`python -m sglang_ext.kernels.targets` (its "sglang" group).

How a kernel variant is found: each served op is called once per target through SGLang's own launcher (the
functions of compat.SGLANG_TRITON_LAUNCHERS) on CPU tensors of the served shapes, with the device flags SGLang's
kernel modules read to pick launch parameters (compat.SGLANG_TRITON_DEVICE_FLAGS) set to the target's. Triton's
launch is recorded instead of run (JITFunction.run), an autotuned kernel gives one launch per config its autotuner
would try on first use, and each recorded launch is specialised by Triton's own binder for the target's backend,
then compiled with triton.compile. What the launchers decide at import time (an autotuner's config list built from
a device query) is what this CPU import decided. Triton 3.8 internals used: JITFunction.run and Autotuner.run
(replaced while recording), create_function_from_signature and JITFunction._pack_args (a JIT launch's
specialisation).

The served shapes are in platform/sglang_triton_scenarios.py.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass

from sglang_ext import compat
from sglang_ext.platform import sglang_triton_scenarios as scenarios

GROUP = "sglang"

# Multiprocessors (CUs) of the card each target is checked as: A100, RTX 3090, H100 SXM, RX 7900 XTX.
SM_COUNT = {"cuda:80": 108, "cuda:86": 82, "cuda:90": 132, "hip:gfx1100": 96}
_ABSENT = object()


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: SGLang's JIT function and the arguments its launcher passed."""
    fn: object
    args: tuple
    kwargs: dict
    config: str  # the autotune config this launch stands for ("" when not autotuned)


def _device_flags(target_name: str) -> dict:
    """The values SGLang's device flags take on the target (compat.SGLANG_TRITON_DEVICE_FLAGS)."""
    backend, arch, _ = _target_tuple(target_name)
    cuda = backend == "cuda"
    capability = (arch // 10, arch % 10) if cuda else (11, 0)  # torch on ROCm reports gfx1100 as 11.0
    return {"_is_hip": not cuda, "_is_cuda": cuda, "CUDA_CAPABILITY": capability, "_is_gfx95": False,
            "_is_gfx1250": False, "_is_sm90": cuda and arch == 90, "_is_sm103": False, "_is_sm107": False,
            "is_amd": not cuda, "is_nvidia": cuda, "is_nvidia_hopper": cuda and arch == 90,
            "is_tf32_supported": cuda, "use_cuda_graph": False,
            # SGLang's own query (kernels/jit/utils/arch.py): programmatic dependent launch from sm_90 on
            "is_arch_support_pdl": lambda *_: cuda and arch >= 90,
            # FLA's input_guard and the gated RMSNorm enter the tensors' device; these tensors are on the CPU
            "custom_device_ctx": lambda *_: contextlib.nullcontext(),
            "device_context": lambda *_: contextlib.nullcontext(),
            # the gated RMSNorm sizes its row blocks by the multiprocessor count
            "_get_sm_count": lambda *_: SM_COUNT[target_name],
            # ROCm's Lean decode sizes its persistent grid the same way
            "_lean_num_cus": lambda *_: SM_COUNT[target_name]}


def _target_tuple(target_name: str):
    from sglang_ext.kernels.targets import TARGETS

    return TARGETS[target_name]


@contextlib.contextmanager
def _as_target(target_name: str, launches: list):
    """SGLang's kernel modules see the target's device flags; Triton launches are appended to `launches`."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    flags = _device_flags(target_name)
    for dotted in compat.SGLANG_TRITON_LAUNCHERS.values():  # imported before their flags are set
        importlib.import_module(dotted.rpartition(".")[0])
    saved = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(compat.SGLANG_TRITON_KERNEL_PACKAGES):
            continue
        for flag in compat.SGLANG_TRITON_DEVICE_FLAGS:
            # CUDA_CAPABILITY exists only where the module was imported with a CUDA device
            if flag in vars(module) or (flag == "CUDA_CAPABILITY" and "_is_cuda" in vars(module)):
                saved.append((module, flag, vars(module).get(flag, _ABSENT)))
                setattr(module, flag, flags[flag])

    def record(fn, *args, grid=None, warmup=False, **kwargs):
        launches.append(Launch(fn, args, kwargs, kwargs.pop("_config", "")))

    def every_config(tuner, *args, **kwargs):
        for config in tuner.configs:
            extra = config.all_kwargs()
            label = " ".join([*(f"{k}={v}" for k, v in sorted(config.kwargs.items())),
                              f"warps={config.num_warps}", f"stages={config.num_stages}"])
            tuner.fn.run(*args, **{**kwargs, **extra, "_config": label})

    jit_run, tuner_run = JITFunction.run, Autotuner.run
    JITFunction.run, Autotuner.run = record, every_config
    try:
        yield
    finally:
        JITFunction.run, Autotuner.run = jit_run, tuner_run
        for module, flag, value in reversed(saved):
            if value is _ABSENT:
                delattr(module, flag)
            else:
                setattr(module, flag, value)


def recorded_launches(target_name: str, scenario: str) -> list[Launch]:
    """The Triton launches SGLang's launcher makes in one scenario (a key of scenarios.scenarios()) on the target."""
    call, _ = scenarios.scenarios()[scenario]
    launches: list[Launch] = []
    with _as_target(target_name, launches):
        call()
    return launches


def compile_jobs(target_name: str, only: tuple[str, ...] = ()) -> list:
    """[(label, thunk, skipped)] for every distinct kernel variant SGLang's launchers start on this target: the thunk
    compiles it and raises what Triton raised; a launcher that fails before launching gives one job that raises its
    error; a scenario not served on the target's backend gives one job with `skipped` set (and no thunk). Only labels
    `only` selects (targets.selected)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from sglang_ext.kernels.targets import selected

    target = GPUTarget(*_target_tuple(target_name))
    backend = make_backend(target)
    jobs, seen = [], set()
    for scenario, (call, backends) in scenarios.scenarios().items():
        if target.backend not in backends:
            if selected(f"sglang {scenario}", only):
                jobs.append((f"sglang {scenario}", None, f"served on {', '.join(backends)} only"))
            continue
        launches: list[Launch] = []
        try:
            with _as_target(target_name, launches):
                call()
        except Exception as e:  # noqa: BLE001 - reported as this scenario's failed row
            if selected(f"sglang {scenario} (launcher)", only):
                jobs.append((f"sglang {scenario} (launcher)", _raiser(e), ""))
        for launch in launches:
            label = f"sglang {scenario} {launch.fn.__name__}" + (f" [{launch.config}]" if launch.config else "")
            if not selected(label, only):
                continue
            kwargs = {**launch.kwargs, "debug": False,
                      "instrumentation_mode": knobs.compilation.instrumentation_mode}
            try:
                binder = create_function_from_signature(launch.fn.signature, launch.fn.params, backend)
                bound, specialization, options = binder(*launch.args, **kwargs)
                options, signature, constexprs, attrs = launch.fn._pack_args(backend, kwargs, bound, specialization,
                                                                            options)
            except Exception as e:  # noqa: BLE001 - reported as this variant's failed row
                jobs.append((label, _raiser(e), ""))
                continue
            key = (launch.fn, str(signature), str(sorted(constexprs.items())), str(attrs), str(options))
            if key in seen:
                continue
            seen.add(key)
            src = ASTSource(launch.fn, signature, constexprs, attrs)
            jobs.append((label, lambda src=src, options=options: triton.compile(src, target=target,
                                                                                options=options.__dict__), ""))
    return jobs


def _raiser(error: Exception):
    def raise_it():
        raise error
    return raise_it
