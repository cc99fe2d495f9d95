"""Read a model's config.json (and its safetensors headers when present) into a ModelShape. Core."""

from __future__ import annotations

import json
from pathlib import Path

from .model_shape import ModelShape
from .weights import read_tensor_bytes, shape_with_checkpoint_bytes


def load_config(model_path: str | Path) -> tuple[dict, Path]:
    """(config dict, folder) for a model folder holding config.json, or a path to a config.json file.
    Raises FileNotFoundError naming the path that was tried."""
    path = Path(model_path)
    config_file = path if path.is_file() else path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json at {config_file}")
    with open(config_file) as f:
        return json.load(f), config_file.parent


# qwen4_exp's n-gram PLE tables in a checkpoint: `<layer>.ple.ple_embedding.ngram_embedding.shard_<i>.weight`
PLE_TABLE_MARK = ".ngram_embedding."


def load_shape(model_path: str | Path, ple_offloaded: bool = False) -> ModelShape:
    """ModelShape of the model at `model_path`; weight bytes from its *.safetensors headers when the folder has
    them (quantized checkpoints then count at their stored size), else estimated from the config.
    ple_offloaded: qwen4_exp's n-gram PLE tables stay off the GPU (`--ple-offload-embedding`, or
    `--ple-offload-backend ssd`), so their layers do not count them."""
    config, folder = load_config(model_path)
    path = Path(model_path)
    name = path.stem if path.is_file() and path.name != "config.json" else folder.name
    if ple_offloaded:
        config.get("text_config", config)["ple_offload_embedding"] = True
    shape = ModelShape.from_config(config, name=name)
    tensors = read_tensor_bytes(folder)
    if ple_offloaded:
        tensors = {n: b for n, b in tensors.items() if PLE_TABLE_MARK not in n}
    return shape_with_checkpoint_bytes(shape, tensors)
