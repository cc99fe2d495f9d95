"""A real `python -m sglang.launch_server` subprocess for end-to-end tests.

Started on a free loopback port, ready when `/health_generate` answers, killed by process group (the server
spawns scheduler and detokenizer children). Its combined output goes to a log file whose tail is attached to
the report of any failing test that used it.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

HOST = "127.0.0.1"
# Flags of the server most end-to-end tests share: float32 (bf16 is emulated and slow on CPUs without
# native bf16), cache report on, and a small device pool with a HiCache host tier behind it.
SHARED_SERVER_ARGS = (
    "--dtype", "float32", "--enable-cache-report", "--max-total-tokens", "1600",
    "--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
    "--hicache-ratio", "3",
)
START_TIMEOUT_S = float(os.environ.get("SGLANG_EXT_TEST_START_TIMEOUT", "600"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model_path: str, args: list[str], env: dict[str, str] | None = None, name: str = "server"):
        self.model_path = model_path
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.name = name
        self.log_path = Path(tempfile.mkdtemp(prefix="sglang-ext-test-")) / f"{name}.log"
        # A server runs its real code paths: the pytest process's TRITON_INTERPRET (set for the kernel tests)
        # is not passed on unless a test asks for it.
        self.env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_path,
                "--host", HOST, "--port", str(self.port), *self.args]

    def start(self, attempts: int = 3) -> "ServerProcess":
        """Start and wait for health. The port is picked free but only bound later by the server, so another
        process can take it first; uvicorn then logs a bind error and hangs instead of exiting. That case is
        retried on a new port."""
        for attempt in range(attempts):
            if attempt:
                self.port = free_port()
                self.url = f"http://{HOST}:{self.port}"
            if self._start_once():
                return self
        raise RuntimeError(f"{self.name}: port taken {attempts} times in a row:\n{self.log_tail()}")

    def _start_once(self) -> bool:
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        deadline = t0 + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            if "address already in use" in self.log_text():
                self.stop()
                return False
            try:
                if requests.get(f"{self.url}/health_generate", timeout=30).status_code == 200:
                    self.startup_seconds = time.monotonic() - t0
                    return True
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"{self.name} not healthy after {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    # --- requests -------------------------------------------------------------------------------
    def generate(self, text=None, input_ids=None, max_new_tokens=32, timeout=600, **sampling) -> dict:
        body = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, **sampling}}
        if input_ids is not None:
            body["input_ids"] = input_ids
        else:
            body["text"] = text
        r = requests.post(f"{self.url}/generate", json=body, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def chat(self, content: str, max_tokens=32, timeout=600) -> dict:
        body = {"model": "default", "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "temperature": 0}
        r = requests.post(f"{self.url}/v1/chat/completions", json=body, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def flush_cache(self, timeout_s: float = 60) -> None:
        """Flush the radix cache; SGLang refuses (400) while requests or HiCache transfers are in flight."""
        deadline = time.monotonic() + timeout_s
        while True:
            r = requests.post(f"{self.url}/flush_cache", timeout=60)
            if r.status_code == 200 or time.monotonic() > deadline:
                r.raise_for_status()
                return
            time.sleep(0.5)

    def server_info(self) -> dict:
        r = requests.get(f"{self.url}/server_info", timeout=60)
        r.raise_for_status()
        return r.json()


class ServerPool:
    """Session-wide servers keyed by their flags: tests that can share a server get the same one.

    At most `max_alive` run at once (a CPU server takes 3-5 GB of RAM in three processes); the least recently
    used is stopped first. Tests that share flags should sit together so that a server is started once.
    """

    def __init__(self, model_path: str, max_alive: int = 1):
        self.model_path = model_path
        self.max_alive = max_alive
        self._servers: dict[tuple, ServerProcess] = {}

    def get(self, *args: str, env: dict[str, str] | None = None, name: str = "server") -> ServerProcess:
        key = (tuple(args), tuple(sorted((env or {}).items())))
        server = self._servers.pop(key, None)
        if server is None or server.proc is None or server.proc.poll() is not None:
            while len(self._servers) >= self.max_alive:
                oldest = next(iter(self._servers))
                self._servers.pop(oldest).stop()
            server = ServerProcess(self.model_path, list(args), env, name).start()
        self._servers[key] = server  # re-insert: most recently used last
        return server

    def stop_all(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()
