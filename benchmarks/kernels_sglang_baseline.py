"""SGLang 0.5.23's own Triton decode attention kernel, the baseline of docs/benchmarks/kernels.md's table, loaded
without installing SGLang (kernels_roofline.py imports it; nothing to run on its own).

A GPU machine that runs the kernel benchmark needs neither SGLang nor network access: the benchmark imports four
unmodified files of the sglang 0.5.23 cp312 wheel
(``sglang/kernels/ops/attention/{decode_attention,extend_attention,score_mod,metadata}.py``) by path, from the
git-ignored folder ``.whl/sglang_0_5_23_kernels/`` copied there with the repository.

Those files import five SGLang-internal names; this module puts tiny stand-ins for
them in ``sys.modules`` first:

* ``sglang.srt.utils``: ``is_hip``/``is_cuda``/``is_gfx95_supported``/``is_gfx1250_supported``/
  ``get_device_core_count`` -- the same one-line device probes SGLang uses on CUDA.
* ``sglang.srt.environ.envs``: the five ``SGLANG_*`` switches the two files read, with
  the 0.5.23 defaults from ``sglang/srt/environ.py`` (all but one only matter on HIP).
* ``sglang.srt.runtime_context.get_exec``: raises ``ValueError`` ("not published yet"),
  which the decode file handles; it is only reached on the MLA path.

Everything else (the kernels, the launch heuristics, ``get_num_kv_splits_triton``)
is SGLang's code as shipped. ``SGLangTritonDecode`` reproduces how
``srt/layers/attention/triton_backend.py`` drives the decode kernel with default
server arguments: ``max_kv_splits = triton_attention_num_kv_splits = 8`` and
per-request split counts from ``get_num_kv_splits_triton``.

To fetch the four files (on a machine with network access)::

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_34_x86_64 -d /tmp/w sglang==0.5.23
    unzip -o -j /tmp/w/sglang-0.5.23-*.whl \
        'sglang/kernels/ops/attention/decode_attention.py' \
        'sglang/kernels/ops/attention/extend_attention.py' \
        'sglang/kernels/ops/attention/score_mod.py' \
        'sglang/kernels/ops/attention/metadata.py' -d .whl/sglang_0_5_23_kernels
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

SGLANG_VERSION = "0.5.23"
KERNEL_FILES = ("score_mod", "metadata", "decode_attention", "extend_attention")
DEFAULT_KERNEL_DIR = Path(__file__).resolve().parent.parent / ".whl" / "sglang_0_5_23_kernels"
# triton_backend.py: max_kv_splits = get_exec().kernel.triton_attention_num_kv_splits (default 8)
SGLANG_DEFAULT_MAX_KV_SPLITS = 8
_ATTN_PKG = "sglang.kernels.ops.attention"

# name -> (parser, 0.5.23 default), from sglang/srt/environ.py
_ENV_DEFAULTS = {
    "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": (bool, False),
    "SGLANG_MLA_DECODE_TUNE": (bool, False),
    "SGLANG_FORCE_LEAN_GRID_CU_MULT": (float, 1.0),
    "SGLANG_TRITON_COMPACT_EXTEND_ATTENTION": (bool, True),
    "SGLANG_TRITON_FP8_PREFILL_ATTN": (bool, True),
}


class _EnvVar:
    def __init__(self, name: str):
        if name not in _ENV_DEFAULTS:
            raise AttributeError(
                f"stub envs has no {name}; known: {sorted(_ENV_DEFAULTS)} "
                "(the carried kernel files read a variable this loader does not know)"
            )
        self.name = name

    def get(self):
        parse, default = _ENV_DEFAULTS[self.name]
        raw = os.environ.get(self.name)
        if raw is None:
            return default
        if parse is bool:
            return raw.lower() in ("1", "true", "yes")
        return parse(raw)


class _Envs:
    def __getattr__(self, name: str) -> _EnvVar:
        return _EnvVar(name)


def _is_hip() -> bool:
    return torch.version.hip is not None


def _is_cuda() -> bool:
    return torch.cuda.is_available() and torch.version.cuda is not None


def _get_device_core_count(device_id: int = 0) -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return 0


def _get_exec():
    raise ValueError("runtime context not published (stand-alone kernel benchmark)")


def _package(name: str, path: list[str] | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = path or []
    return module


def _install_stubs(kernel_dir: Path) -> None:
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_hip = _is_hip
    utils.is_cuda = _is_cuda
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = _get_device_core_count
    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = _Envs()
    runtime_context = types.ModuleType("sglang.srt.runtime_context")
    runtime_context.get_exec = _get_exec
    stubs = {
        "sglang": _package("sglang"),
        "sglang.kernels": _package("sglang.kernels"),
        "sglang.kernels.ops": _package("sglang.kernels.ops"),
        _ATTN_PKG: _package(_ATTN_PKG, [str(kernel_dir)]),
        "sglang.srt": _package("sglang.srt"),
        "sglang.srt.utils": utils,
        "sglang.srt.environ": environ,
        "sglang.srt.runtime_context": runtime_context,
    }
    for name, module in stubs.items():
        if name in sys.modules and not getattr(sys.modules[name], "_sglang_ext_stub", False):
            raise RuntimeError(
                f"{name} is already imported from a real SGLang; load the baseline in a "
                "fresh process or import the real module instead"
            )
        module._sglang_ext_stub = True
        sys.modules[name] = module


def load_sglang_kernels(kernel_dir: Path | str | None = None) -> dict[str, types.ModuleType]:
    """Import the carried SGLang kernel files; returns {"decode_attention": module, ...}.

    Idempotent. Raises FileNotFoundError naming the refresh recipe when a file is missing.
    """
    kernel_dir = Path(kernel_dir or os.environ.get("SGLANG_KERNEL_DIR", DEFAULT_KERNEL_DIR))
    missing = [f for f in KERNEL_FILES if not (kernel_dir / f"{f}.py").is_file()]
    if missing:
        raise FileNotFoundError(
            f"missing {missing} in {kernel_dir}; see the module docstring of {__file__} "
            "for how to extract them from the sglang 0.5.23 wheel"
        )
    if "sglang.srt.utils" not in sys.modules:
        _install_stubs(kernel_dir)
    modules = {}
    for name in KERNEL_FILES:
        full = f"{_ATTN_PKG}.{name}"
        if full not in sys.modules:
            spec = importlib.util.spec_from_file_location(full, kernel_dir / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[full] = module
            spec.loader.exec_module(module)
        modules[name] = sys.modules[full]
    return modules


class SGLangTritonDecode:
    """SGLang's bf16/fp16 decode attention as ``TritonAttnBackend`` runs it (default args).

    Buffers: ``k_buffer``/``v_buffer`` ``[num_slots, H_kv, D]``; ``q``/``o`` ``[B, H_q, D]``;
    ``kv_indptr`` ``[B + 1]`` int32, ``kv_indices`` int64/int32. Planning (split counts,
    scratch buffers) happens in ``plan``; ``run`` launches the two kernels and nothing else.
    """

    def __init__(self, max_kv_splits: int = SGLANG_DEFAULT_MAX_KV_SPLITS):
        mods = load_sglang_kernels()
        self._decode = mods["decode_attention"].decode_attention_fwd
        self._splits_kernel = mods["metadata"].get_num_kv_splits_triton
        self.max_kv_splits = max_kv_splits

    def plan(self, seq_lens: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int):
        import triton

        batch = seq_lens.shape[0]
        device = seq_lens.device
        self.num_kv_splits = torch.empty(batch, dtype=torch.int32, device=device)
        core_count = _get_device_core_count(device.index or 0) if device.type == "cuda" else 0
        if core_count <= 0:
            self.num_kv_splits.fill_(self.max_kv_splits)
        else:
            self._splits_kernel[(1,)](
                self.num_kv_splits,
                seq_lens,
                batch,
                1,
                num_q_heads,
                num_kv_heads,
                self.max_kv_splits,
                core_count,
                MAX_NUM_SEQ=max(256, triton.next_power_of_2(batch)),
            )
        self.attn_logits = torch.empty(
            (batch, num_q_heads, self.max_kv_splits, head_dim), dtype=torch.float32, device=device
        )
        self.attn_lse = torch.empty(
            (batch, num_q_heads, self.max_kv_splits), dtype=torch.float32, device=device
        )

    def run(self, q, k_buffer, v_buffer, o, kv_indptr, kv_indices, sm_scale, page_size=1):
        self._decode(
            q,
            k_buffer,
            v_buffer,
            o,
            kv_indptr,
            kv_indices,
            self.attn_logits,
            self.attn_lse,
            self.num_kv_splits,
            self.max_kv_splits,
            sm_scale,
            1.0,
            1.0,
            page_size=page_size,
        )


def sglang_extend(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr,
                  kv_indptr, kv_indices, max_len_extend, sm_scale, page_size=1):
    """SGLang's ``extend_attention_fwd`` as ``forward_extend`` calls it for a plain causal batch.

    ``kv_indptr``/``kv_indices`` describe the PREFIX only (the new tokens come from
    ``k_extend``/``v_extend``), exactly as in SGLang.
    """
    fwd = load_sglang_kernels()["extend_attention"].extend_attention_fwd
    fwd(
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        None,
        True,
        None,
        max_len_extend,
        1.0,
        1.0,
        sm_scale=sm_scale,
        page_size=page_size,
    )
