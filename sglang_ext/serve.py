"""`python -m sglang_ext.serve [launch_server args...]`: what `make serve` runs.

Prepares the built-in model (unless `--model-path` is given), checks the platform choice, prints the URL and
a curl example, then replaces itself with stock `python -m sglang.launch_server` — sglang-ext is active there
through its entry points, not through this script. On a host with a GPU SGLang uses it; otherwise the
portable CPU platform activates.
"""

import os
import sys
from importlib.metadata import entry_points

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
PLATFORM_GROUP = "sglang.srt.platforms"


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def check_platform_env() -> None:
    selected = os.environ.get("SGLANG_PLATFORM")
    if not selected:
        return
    names = sorted(ep.name for ep in entry_points(group=PLATFORM_GROUP))
    if selected not in names:
        print(f"sglang-ext: error: SGLANG_PLATFORM={selected!r} is not an installed platform "
              f"(installed: {', '.join(names) or 'none'}); unset it to pick one automatically", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    check_platform_env()
    if _flag_value(argv, "--model-path") is None:
        from sglang_ext.models import prepare

        argv = ["--model-path", str(prepare())] + argv
    host = _flag_value(argv, "--host") or DEFAULT_HOST
    port = _flag_value(argv, "--port") or str(DEFAULT_PORT)
    argv += [] if _flag_value(argv, "--host") else ["--host", host]
    argv += [] if _flag_value(argv, "--port") else ["--port", port]

    from sglang_ext.platform import has_accelerator

    where = "GPU" if has_accelerator() else "portable CPU platform"
    url = f"http://{host}:{port}"
    print(f"sglang-ext: starting SGLang on the {where} at {url} (ready when /health_generate answers)")
    print("sglang-ext: try:\n"
          f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
          "    -d '{\"model\": \"default\", \"messages\": [{\"role\": \"user\", "
          "\"content\": \"What is the capital of France?\"}], \"max_tokens\": 32, \"temperature\": 0}'", flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "sglang.launch_server", *argv])


if __name__ == "__main__":
    main()
