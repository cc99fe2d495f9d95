"""Layer partitions: parsing, the check, and SGLang's default even split. Core: never imports sglang.

A partition is a tuple of layer counts, one per pipeline stage, in stage order (the format of
SGLANG_PP_LAYER_PARTITION). Stage s owns layers [sum(p[:s]), sum(p[:s+1])).
"""

from __future__ import annotations

from typing import Sequence


class PartitionError(ValueError):
    """An explicit or planned layer partition that SGLang cannot run; the message is one line."""


def parse_partition(text: str) -> tuple[int, ...]:
    """'8,11,11' -> (8, 11, 11). Raises PartitionError on anything but comma-separated non-negative ints."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() for p in parts):
        raise PartitionError(
            f"pp layer partition {text!r} is not 'auto' or a comma-separated list of layer counts such as 8,11,11"
        )
    return tuple(int(p) for p in parts)


def format_partition(partition: Sequence[int]) -> str:
    return ",".join(str(n) for n in partition)


def stage_ranges(partition: Sequence[int]) -> list[tuple[int, int]]:
    """[(start, end)) layer range of each stage."""
    ranges, start = [], 0
    for n in partition:
        ranges.append((start, start + n))
        start += n
    return ranges


def default_partition(num_layers: int, pp_size: int) -> tuple[int, ...]:
    """SGLang 0.5.23's even split (distributed/utils.py::get_pp_indices without SGLANG_PP_LAYER_PARTITION):
    num_layers // pp_size layers per stage, the remainder one extra layer each on the LAST stages."""
    base, rem = divmod(num_layers, pp_size)
    return tuple(base + (1 if s >= pp_size - rem else 0) for s in range(pp_size))


def check_partition(
    partition: Sequence[int],
    pp_size: int,
    num_layers: int,
    raw_id_layers: Sequence[int] = (),
    raw_id_reason: str = "raw input ids",
) -> None:
    """Raise PartitionError (one line) unless `partition` can run: one entry per stage, the entries sum to the
    model's layer count, no stage is empty, and every layer that reads the raw input ids is on stage 0."""
    text = format_partition(partition)
    if len(partition) != pp_size:
        raise PartitionError(f"pp layer partition {text} has {len(partition)} stages but --pp-size is {pp_size}")
    total = sum(partition)
    if total != num_layers:
        raise PartitionError(f"pp layer partition {text} covers {total} layers but the model has {num_layers}")
    for stage, n in enumerate(partition):
        if n <= 0:
            raise PartitionError(
                f"pp layer partition {text} leaves stage {stage} without layers; every stage needs one"
            )
    first_end = partition[0]
    for layer in sorted(raw_id_layers):
        if layer >= first_end:
            stage = next(s for s, (a, b) in enumerate(stage_ranges(partition)) if a <= layer < b)
            raise PartitionError(
                f"layer {layer} reads the raw input ids ({raw_id_reason}) and must be on stage 0, but pp layer "
                f"partition {text} puts it on stage {stage}; stage 0 needs at least {layer + 1} layers"
            )
