"""Pipeline-parallel partition planner and check (core), and `--pp-layer-partition` (glue: server_args.py).

    shape = load_shape("path/to/model")                  # or ModelShape.from_config(config_dict)
    plan = plan_partition(shape, tp=2, pp=3, opts=PlanOptions(gpu_mem_gib=(24.0,) * 6))
    plan.partition, plan.capacity                        # (21, 22, 21), KV tokens SGLang will allocate

Importing this package never imports sglang; `sglang_ext.pp.server_args` does.
"""

from .loading import load_config, load_shape
from .model_shape import ModelShape
from .partition import PartitionError, check_partition, default_partition, format_partition, parse_partition
from .planner import Evaluation, PlanOptions, evaluate_default, evaluate_partition, plan_partition
from .report import Candidate, best_candidate, plan_gpus, render

__all__ = [
    "Candidate",
    "Evaluation",
    "ModelShape",
    "PartitionError",
    "PlanOptions",
    "best_candidate",
    "check_partition",
    "default_partition",
    "evaluate_default",
    "evaluate_partition",
    "format_partition",
    "load_config",
    "load_shape",
    "parse_partition",
    "plan_gpus",
    "plan_partition",
    "render",
]
