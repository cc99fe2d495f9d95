"""Paged MoE experts on top of SGLang's `--enable-paged-experts`: residency policies and their simulator (core),
the torch expert compute of the portable CPU platform (core), the plan command (`python -m sglang_ext.moe plan`),
and the SGLang glue (`sglang_glue.py`)."""
