"""End to end: a tiny random Gemma 3n served by SGLang on the CPU platform, per-layer embeddings in RAM and on
SSD (`--ple-offload-backend ssd`), gives the same greedy tokens.

Needs the sglang-ext plugin to call `sglang_ext.ple.sglang_glue.register()` in every SGLang process; the SSD
server's log must show the table being served from the checkpoint file, so a silently ignored flag fails.
"""

import inspect

import pytest

import sglang_ext.plugin
from server import ServerProcess
from tiny_gemma3n import build_tiny_gemma3n

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,"]
FLAGS = ["--dtype", "float32", "--max-total-tokens", "1024", "--disable-radix-cache"]


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory, model_dir):
    from pathlib import Path

    return build_tiny_gemma3n(tmp_path_factory.mktemp("tiny_gemma3n_e2e"), Path(model_dir))


@pytest.mark.skipif("sglang_glue" not in inspect.getsource(sglang_ext.plugin),
                    reason="sglang_ext.plugin.load() does not call sglang_ext.ple.sglang_glue.register() yet")
def test_gemma3n_ssd_matches_ram(tiny_gemma):
    outputs = {}
    for backend in ("pinned", "ssd"):
        server = ServerProcess(str(tiny_gemma), [*FLAGS, "--ple-offload-backend", backend], name=f"gemma3n-{backend}")
        server.start()
        try:
            outputs[backend] = [server.generate(text=p, max_new_tokens=24)["text"] for p in PROMPTS]
            log = server.log_text()
        finally:
            server.stop()
        served_from_ssd = "Gemma 3n per-layer embeddings" in log and "served from" in log
        assert served_from_ssd == (backend == "ssd"), f"{backend}: SSD store log line present={served_from_ssd}"
    assert all(outputs["pinned"]), f"empty generations: {outputs['pinned']}"
    assert outputs["ssd"] == outputs["pinned"], f"RAM: {outputs['pinned']}\nSSD: {outputs['ssd']}"
