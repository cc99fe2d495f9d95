"""The offline bundle: what `python -m sglang.launch_server` with sglang-ext needs on a GPU machine that has torch and
Triton and no network: one folder of at most 64 MiB (two archives and a script).

    python -m sglang_ext.bundle pack --out DIR      # where this environment is installed and PyPI is reachable
    python3 DIR/serve_tiny.py                       # on the GPU machine, after copying DIR there

contents.py lists what travels, pack.py builds the archives, target.py (copied next to them as serve_tiny.py) unpacks
them and serves a tiny model created there from a config.
"""
