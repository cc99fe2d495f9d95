"""Shared fixtures: the built-in model folder and a pool of real SGLang servers shared across tests."""

import os

# Triton kernels run on the CPU interpreter in CI. Set here, before any test module imports a kernel module
# (Triton picks the interpreter when a kernel is defined); servers started by tests do not inherit it.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from server import SHARED_SERVER_ARGS, ServerPool, ServerProcess


@pytest.fixture(scope="session")
def model_dir() -> str:
    from sglang_ext.models import prepare

    return str(prepare())


@pytest.fixture(scope="session")
def server_pool(model_dir):
    pool = ServerPool(model_dir)
    yield pool
    pool.stop_all()


@pytest.fixture
def shared_server(server_pool) -> ServerProcess:
    return server_pool.get(*SHARED_SERVER_ARGS, name="shared")


# The server tests in two work units of about equal length, each on its own worker with its own ServerPool: the
# speculative-decoding servers (1840 s on a 2-core AVX2 CPU, 2026-12-02), and the rest (2300 s).
SERVERS_B = ("tests/spec/",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Work units for `pytest -n 2 --dist loadgroup` (pyproject's addopts). A test that starts SGLang servers
    runs in one of two groups ("servers-a", "servers-b"), each on one worker in file order: servers are shared
    across modules, one alive per worker at a time. Any other module runs whole on whichever worker is free (its
    module fixtures built once). A module that starts servers without the pool marks itself
    `xdist_group("servers-a")`."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        path = item.nodeid.split("::")[0]
        if "server_pool" in item.fixturenames:
            group = "servers-b" if path.startswith(SERVERS_B) else "servers-a"
        else:
            group = path
        item.add_marker(pytest.mark.xdist_group(group))
    if config.getoption("dist", "no") == "loadgroup":
        # Units go out in order of first appearance (--no-loadscope-reorder): the two server groups first, one to
        # each worker, then the other modules in file order to whichever worker is free.
        items.sort(key=lambda item: not item.get_closest_marker("xdist_group").args[0].startswith("servers-"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, ServerProcess):
            report.sections.append((f"server log tail ({value.name}, {value.log_path})", value.log_tail()))
