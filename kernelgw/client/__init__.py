"""The Python SDK: `Client` and `AsyncClient`, their sessions, and `Execution`,
the result of one cell built from its wire events.

May import: ``kernelgw.errors``, ``kernelgw.events``, ``kernelgw.models`` and the
client's own dependencies (httpx, websockets, pydantic). Never the server, the
runtime, storage or the image builder: ``pip install kernelgw`` installs this
without them.
"""

from kernelgw.client.execution import Execution, ExecutionBuilder, ExecutionError, Output
from kernelgw.client.sdk import (
    DEFAULT_URL,
    AsyncClient,
    AsyncSession,
    Client,
    ReplayedCell,
    Session,
    SessionInfo,
    error_from_close,
    error_from_response,
)

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "AsyncSession",
    "Client",
    "Execution",
    "ExecutionBuilder",
    "ExecutionError",
    "Output",
    "ReplayedCell",
    "Session",
    "SessionInfo",
    "error_from_close",
    "error_from_response",
]
