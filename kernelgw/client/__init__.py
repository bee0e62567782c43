"""The Python SDK: `Client` and `AsyncClient`, their sessions, and `Execution`,
the result of one cell built from its wire events.

    with Client("http://127.0.0.1:8000") as client:
        with client.session() as session:
            session.run("x = 41")
            print(session.run("x + 1").text)            # 42
            for event in session.stream("print('hi')"):
                ...

Modules: ``_base`` builds every request and parses every answer (`_Call`,
`_BaseClient`, `_SessionBase`); ``_stream`` runs the WebSocket protocol of one
streamed execution (`_StreamState`); ``_sync`` (`Client`, `Session`) and
``_async`` (`AsyncClient`, `AsyncSession`) are thin shells that only move bytes
with httpx and websockets' sync or asyncio client, and import the base, never
each other; ``_errors`` maps error answers to `kernelgw.errors.ClientError`;
``execution`` holds `Execution`.

Errors: an error answer from the gateway raises `kernelgw.errors.ClientError`
(``status_code``, ``code``, ``message``); a WebSocket closed with code ``4xxx``
raises it with status ``xxx``. Network failures surface as httpx / OSError
exceptions.

May import: ``kernelgw.errors``, ``kernelgw.events``, ``kernelgw.models`` and the
client's own dependencies (httpx, websockets, pydantic). Never the server, the
runtime, storage or the image builder: ``pip install kernelgw`` installs this
without them.
"""

from kernelgw.client._async import AsyncClient, AsyncSession
from kernelgw.client._base import DEFAULT_URL
from kernelgw.client._errors import error_from_close, error_from_response
from kernelgw.client._sync import Client, Session
from kernelgw.client.execution import Execution, ExecutionBuilder, ExecutionError, Output
from kernelgw.models import (
    ForkReport,
    KernelInfo,
    NamespaceReport,
    PausedSession,
    ReplayedCell,
    ReplayReport,
    ReplayReportCell,
    RestartedSession,
    ResumedSession,
    SessionInfo,
)

__all__ = [
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
]
