"""sglang-ext: long-context serving features for SGLang 0.5.23, as a plugin package."""

__version__ = "0.1.0"
