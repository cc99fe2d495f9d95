import os

# Also set by tests/conftest.py; kept so this folder can run alone from another rootdir.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> str:
    """cpu under the interpreter; cuda when run on a GPU with TRITON_INTERPRET=0."""
    if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available():
        return "cuda"
    return "cpu"
