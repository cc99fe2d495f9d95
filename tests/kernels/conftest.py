import os

# Triton kernels run on the CPU interpreter in CI; must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> str:
    """cpu under the interpreter; cuda when run on a GPU with TRITON_INTERPRET=0."""
    if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available():
        return "cuda"
    return "cpu"
