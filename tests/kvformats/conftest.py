import os

# Triton kernels run on the CPU interpreter in CI; must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
