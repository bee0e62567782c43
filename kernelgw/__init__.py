"""kernelgw: stateful, sandboxed Jupyter kernels for AI agents."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["AsyncClient", "Client", "Execution", "__version__"]

if TYPE_CHECKING:
    from kernelgw.client import AsyncClient, Client
    from kernelgw.client.execution import Execution


def __getattr__(name: str) -> Any:
    # The SDK is imported lazily so the gateway never pays for it and vice versa.
    if name in ("Client", "AsyncClient"):
        from kernelgw import client

        return getattr(client, name)
    if name == "Execution":
        from kernelgw.client.execution import Execution

        return Execution
    raise AttributeError(name)
