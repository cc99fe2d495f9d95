"""Published model configs for the planner tests (tests/pp/configs/*.json)."""

import json
from pathlib import Path

from sglang_ext.pp import ModelShape

CONFIGS = Path(__file__).parent / "configs"


def load_config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def shape_of(name: str, **overrides) -> ModelShape:
    """The shape of configs/<name>.json with `overrides` applied to its (text) config."""
    config = load_config(name)
    config.get("text_config", config).update(overrides)
    return ModelShape.from_config(config, name=name)
