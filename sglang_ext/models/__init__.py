"""The built-in default model: SmolLM2-135M-Instruct, converted from the GGUF shipped on PyPI."""

from sglang_ext.models.builtin import DEFAULT_MODEL_NAME, default_model_dir, prepare

__all__ = ["DEFAULT_MODEL_NAME", "default_model_dir", "prepare"]
