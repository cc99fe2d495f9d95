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


def load_shape(model_path: str | Path) -> ModelShape:
    """ModelShape of the model at `model_path`; weight bytes from its *.safetensors headers when the folder has
    them (quantized checkpoints then count at their stored size), else estimated from the config."""
    config, folder = load_config(model_path)
    path = Path(model_path)
    name = path.stem if path.is_file() and path.name != "config.json" else folder.name
    shape = ModelShape.from_config(config, name=name)
    return shape_with_checkpoint_bytes(shape, read_tensor_bytes(folder))
