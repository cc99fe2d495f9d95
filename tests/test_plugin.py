"""The plugin is found through SGLang's own loader, and bad input gives one clear line."""

import os
import subprocess
import sys

PLUGIN_PROBE = r"""
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, PLATFORM_PLUGINS_GROUP, load_plugins, load_plugins_by_group
general = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
platforms = load_plugins_by_group(PLATFORM_PLUGINS_GROUP)
assert "sglang_ext" in general, sorted(general)
assert list(platforms) == ["portable_cpu"], sorted(platforms)
load_plugins()
from sglang_ext.plugin import registered
print("REGISTERED", registered())
print("PLATFORM", platforms["portable_cpu"][0]())
"""


def _run(cmd, env_extra=None, timeout=300):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def test_sglang_loader_finds_and_loads_plugin():
    r = _run([sys.executable, "-c", PLUGIN_PROBE])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "REGISTERED ['sglang-ext" in r.stdout and "platform portable_cpu" in r.stdout, r.stdout
    assert "PLATFORM sglang_ext.platform.cpu.PortableCpuPlatform" in r.stdout, r.stdout


def test_unknown_platform_is_one_clear_line(model_dir):
    r = _run([sys.executable, "-m", "sglang_ext.serve", "--model-path", model_dir], {"SGLANG_PLATFORM": "nosuch"})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "SGLANG_PLATFORM='nosuch'" in lines[0] and "portable_cpu" in lines[0], r.stderr
    # Stock launch_server: SGLang's own discovery refuses it and names the installed platform.
    r = _run([sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir], {"SGLANG_PLATFORM": "nosuch"})
    assert r.returncode != 0
    assert "SGLANG_PLATFORM='nosuch' not found" in r.stderr and "'portable_cpu'" in r.stderr, r.stderr[-2000:]


def test_missing_model_folder_is_one_clear_line(tmp_path):
    missing = str(tmp_path / "no-such-model")
    r = _run([sys.executable, "-m", "sglang.launch_server", "--model-path", missing])
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"sglang-ext: error: --model-path {missing}: no such folder"], r.stderr[-2000:]
