"""Lab and test-vehicle tooling: not part of the installed `sglang_ext` package, not loaded by SGLang.

Run from the repository root (`python -m tools.draft_training ...`); tests reach it through the repository root
that tests/conftest.py puts on sys.path, benchmarks by inserting the root themselves.

- `draft_training/`: `python -m tools.draft_training` trains an MTP draft layer for the built-in model on CPU and
  writes a MiMo checkpoint SGLang serves with `--speculative-algorithm NEXTN`.
- `attention_error.py`: attention-output error of a KV format against float64 attention (the quality metric the
  KV-format tests threshold; `python -m tools.attention_error` prints the table of docs/formats.md).
- `native_loop.py`, `spec_gpu_loop.py`: a NEXTN decode loop over our kernels without SGLang, to time speculative
  decoding on a GPU where SGLang is not installed.
"""
