"""The names users import: a rename or a move inside the package must not change
them (the layout of the modules behind them is free to change)."""

from __future__ import annotations

import subprocess
import sys

import kernelgw
import kernelgw.client


def test_top_level_names() -> None:
    assert set(kernelgw.__all__) == {"AsyncClient", "Client", "Execution", "__version__"}
    assert kernelgw.Client is kernelgw.client.Client
    assert kernelgw.AsyncClient is kernelgw.client.AsyncClient
    assert kernelgw.Execution is kernelgw.client.Execution


def test_sdk_names() -> None:
    assert set(kernelgw.client.__all__) == {
        "DEFAULT_URL",
        "AsyncClient",
        "AsyncSession",
        "Client",
        "Execution",
        "ExecutionBuilder",
        "ExecutionError",
        "ForkReport",
        "KernelInfo",
        "NamespaceReport",
        "Output",
        "PausedSession",
        "ReplayReport",
        "ReplayReportCell",
        "ReplayedCell",
        "RestartedSession",
        "ResumedSession",
        "Session",
        "SessionInfo",
        "error_from_close",
        "error_from_response",
    }
    assert all(getattr(kernelgw.client, name) is not None for name in kernelgw.client.__all__)


def test_importing_the_sdk_loads_no_server_code() -> None:
    """The client install has no server packages; importing the SDK must not
    even try to load them (checked in a fresh interpreter)."""
    code = (
        "import sys, kernelgw, kernelgw.client\n"
        "from kernelgw import Client\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'starlette', 'docker', 'sqlalchemy', 'jupyter_client', 'zmq', 'uvicorn') "
        "or m.startswith(('kernelgw.server', 'kernelgw.runtime', 'kernelgw.storage', 'kernelgw.image')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
