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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, ServerProcess):
            report.sections.append((f"server log tail ({value.name}, {value.log_path})", value.log_tail()))
