import os

# Also set by tests/conftest.py; kept so this folder can run alone from another rootdir.
os.environ.setdefault("TRITON_INTERPRET", "1")
