"""Plan every (TP, PP) shape for N GPUs and render the result as text. Core: never imports sglang."""

from __future__ import annotations

import dataclasses

from .factorizations import factorizations, pp_problems, tp_problems
from .model_shape import ModelShape
from .partition import PartitionError, format_partition, stage_ranges
from .planner import GIB, Evaluation, PlanOptions, evaluate_default, plan_partition


@dataclasses.dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    problems: tuple[str, ...]  # why SGLang cannot run this shape (empty: it can)
    plan: Evaluation | None
    default: Evaluation | None  # SGLang's even split, for comparison

    @property
    def fits(self) -> bool:
        """Runnable and, when GPU memory is known, leaves room for at least one KV token."""
        return not self.problems and self.plan is not None and (self.plan.capacity is None or self.plan.capacity > 0)

    @property
    def gain(self) -> float | None:
        """Planned over default capacity, minus 1 (None when unknown or the default holds nothing)."""
        if not self.fits or self.plan.capacity is None or not self.default.capacity:
            return None
        return self.plan.capacity / self.default.capacity - 1.0


def plan_gpus(shape: ModelShape, num_gpus: int, opts: PlanOptions, tp: int | None = None) -> list[Candidate]:
    """One Candidate per (tp, pp) with tp * pp == num_gpus (only `tp` when given), by increasing tp."""
    out = []
    for t, p in factorizations(num_gpus):
        if tp is not None and t != tp:
            continue
        problems = tuple(tp_problems(shape, t) + pp_problems(shape, p))
        plan = default = None
        if not problems:
            try:
                plan = plan_partition(shape, t, p, opts)
            except PartitionError as exc:
                problems = (str(exc),)
            else:
                default = evaluate_default(shape, t, p, opts)
        out.append(Candidate(t, p, problems, plan, default))
    return out


def best_candidate(candidates: list[Candidate]) -> Candidate | None:
    """Largest KV capacity; ties (or unknown memory) go to the faster modelled bottleneck, then smaller tp."""
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return None
    return min(fitting, key=lambda c: (-(c.plan.capacity or 0), round(c.plan.bottleneck_ms, 6), c.tp))


def _tokens(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def render(shape: ModelShape, num_gpus: int, opts: PlanOptions, candidates: list[Candidate]) -> str:
    mem = opts.gpu_mem_gib
    mem_text = "unknown (planning layer counts and modelled time only)" if mem is None else (
        f"{num_gpus} x {mem[0]:g} GiB" if len(set(mem)) == 1 else " + ".join(f"{m:g}" for m in mem) + " GiB"
    )
    lines = [
        f"model: {shape.name}: {shape.num_layers} layers ({shape.num_kv_layers} with a KV cache), hidden "
        f"{shape.hidden_size}, vocab {shape.vocab_size}, {shape.num_heads} heads / {shape.num_kv_heads} KV heads, "
        f"weights {shape.total_weight_bytes() / GIB:.1f} GiB",
        f"GPUs: {mem_text}; --kv-cache-dtype {opts.kv_cache_dtype}",
    ]
    if shape.raw_id_layers:
        lines.append(f"pinned to stage 0: layers {list(shape.raw_id_layers)} ({shape.raw_id_reason})")
    lines += [
        "",
        f"(TP, PP) factorizations of {num_gpus} GPUs:",
        "  tp  pp  KV tokens planned  KV tokens default       gain  bottleneck ms",
    ]
    for c in candidates:
        if c.problems:
            lines.append(f"  {c.tp:>2}  {c.pp:>2}  invalid: {'; '.join(c.problems)}")
        elif not c.fits:
            lines.append(f"  {c.tp:>2}  {c.pp:>2}  weights do not fit: no room left for the KV cache")
        else:
            gain = "-" if c.plan.capacity is None else "default 0" if not c.default.capacity else f"{c.gain:+.1%}"
            lines.append(
                f"  {c.tp:>2}  {c.pp:>2}  {_tokens(c.plan.capacity):>17}  {_tokens(c.default.capacity):>17}  "
                f"{gain:>9}  {c.plan.bottleneck_ms:>13.2f} (default {c.default.bottleneck_ms:.2f})"
            )
    best = best_candidate(candidates)
    if best is None:
        lines += ["", "no factorization fits these GPUs"]
        return "\n".join(lines)
    plan, text = best.plan, format_partition(best.plan.partition)
    flags = f"--tp-size {best.tp} --pp-size {best.pp} --pp-layer-partition {text}"
    lines += ["", f"best: tp {best.tp} x pp {best.pp}: {flags}"]
    lines.append("  stage  layers    GPUs       weights/GPU  KV layers  KV tokens (stage alone)  modelled ms")
    for s, (a, b) in enumerate(stage_ranges(plan.partition)):
        gpus = ",".join(str(g) for g in range(s * best.tp, (s + 1) * best.tp))
        tokens = None if plan.stage_tokens is None else plan.stage_tokens[s]
        lines.append(
            f"  {s:>5}  {f'{a}-{b - 1}':<8}  {gpus:<9}  {plan.weight_gib[s]:>8.2f} GiB  {plan.kv_layers[s]:>9}  "
            f"{_tokens(tokens):>23}  {plan.stage_ms[s]:>11.2f}"
        )
    default_text = format_partition(best.default.partition)
    if plan.capacity is not None:
        gain = "" if best.gain is None else f" ({best.gain:+.1%})"
        lines.append(
            f"  KV capacity (SGLang's min over ranks): {plan.capacity:,} tokens; SGLang's default split "
            f"{default_text}: {_tokens(best.default.capacity)} tokens{gain}"
        )
    if plan.mamba_slots is not None:
        lines.append(
            f"  recurrent state (linear-attention layers per stage {format_partition(plan.state_layers)}): "
            f"{plan.mamba_slots:,} requests' state fits (SGLang's default split: {best.default.mamba_slots:,})"
        )
    lines.append(
        f"  modelled bottleneck stage: {plan.bottleneck_ms:.2f} ms vs {best.default.bottleneck_ms:.2f} ms default "
        f"(decode step, {opts.decode_batch} seqs x {opts.context_tokens} tokens, {opts.bandwidth_gbs:g} GB/s)"
    )
    return "\n".join(lines)
