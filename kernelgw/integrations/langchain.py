"""A LangChain tool that runs Python in a kernelgw session (``pip install 'kernelgw[langchain]'``).

    from langchain.agents import create_agent
    from kernelgw.integrations.langchain import KernelGWTool

    with KernelGWTool(base_url="http://127.0.0.1:8000") as python:
        agent = create_agent(model, [python])
        agent.invoke({"messages": [("user", "What is the sum of the first 10000 numbers?")]},
                     {"configurable": {"thread_id": "chat-1"}})

One kernel per conversation: each LangGraph ``thread_id`` (from the run's
``config["configurable"]``) gets its own session, created on the first call;
calls without a thread id share the tool's own session. Sync and async calls of
the same conversation reach the same kernel. ``close()`` / ``aclose()`` (or the
``with`` block) delete the sessions the tool created; ``close(thread_id=...)``
ends one conversation's session.

The tool answers with ``response_format="content_and_artifact"``: the content is
the compact text observation of `kernelgw.integrations.observation` (what the
model reads), the artifact a JSON-able dict with the rich outputs (base64 images,
HTML tables, the files the code created or changed, the session id) for the
application: ``ToolMessage.artifact``.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Literal

from kernelgw.integrations import require

require("langchain_core", "langchain", "kernelgw.integrations.langchain")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForToolRun,
    CallbackManagerForToolRun,
)
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import BaseTool  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator  # noqa: E402

from kernelgw.client import DEFAULT_URL, AsyncClient, AsyncSession, Client, Session  # noqa: E402
from kernelgw.errors import ClientError  # noqa: E402
from kernelgw.integrations.observation import (  # noqa: E402
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_SECTION_CHARS,
    DEFAULT_TRACEBACK_FRAMES,
    Observation,
    observe,
)
from kernelgw.integrations.tools import CODE_DESCRIPTION, TOOL_DESCRIPTION, TOOL_NAME, tool_text  # noqa: E402

__all__ = ["KernelGWTool", "RunPythonInput"]

ENDED_NOTE = (
    "note: the previous session had ended (idle timeout or a gateway restart); this is a new one, "
    "so earlier variables and files are gone."
)


class RunPythonInput(BaseModel):
    """The tool's arguments."""

    code: str = Field(description=CODE_DESCRIPTION)


_DEFAULT_KEY = "\x00default"
"""The session of calls without a thread id."""


class KernelGWTool(BaseTool):
    """Runs Python in a stateful kernelgw session, one per conversation (thread id)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = TOOL_NAME
    description: str = TOOL_DESCRIPTION
    args_schema: type[BaseModel] = RunPythonInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"

    base_url: str = DEFAULT_URL
    """The kernelgw gateway."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request (e.g. an authenticating proxy's token)."""
    timeout: float | None = None
    """Per-execution timeout in seconds (default: the gateway's)."""
    session_options: dict[str, Any] = Field(default_factory=dict)
    """Passed to ``create_session``: ``kernel``, ``memory_mb``, ``cpus``, ``env``, ``image``, ``timeout``."""
    kernel: str | None = None
    """The sessions' kernel (language): python3, deno, ir, bash, java, go, cpp, ruby.
    Unless given, the tool's name and description follow it (``run_ruby``, ...)."""
    session_id: str | None = None
    """Use this existing session for calls without a thread id (it is not deleted on close)."""
    per_thread: bool = True
    """One session per LangGraph thread id; False: every call uses one session."""
    images_in_content: bool = False
    """Also show images to the model: the content becomes text and image blocks
    (for multimodal models); they are in the artifact either way."""
    max_chars: int = DEFAULT_MAX_CHARS
    max_section_chars: int = DEFAULT_MAX_SECTION_CHARS
    traceback_frames: int = DEFAULT_TRACEBACK_FRAMES

    @model_validator(mode="before")
    @classmethod
    def _texts_for_the_kernel(cls, data: Any) -> Any:
        """A ``kernel`` names the tool and its sessions' language unless given."""
        if isinstance(data, dict) and data.get("kernel"):
            text = tool_text(data["kernel"])  # an unknown kernel fails here, naming the known ones
            data = {"name": text.name, "description": text.description, **data}
            data["session_options"] = {"kernel": data["kernel"], **(data.get("session_options") or {})}
        return data

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _ids: dict[str, str] = PrivateAttr(default_factory=dict)
    """Key (thread id) -> gateway session id."""
    _owned: set[str] = PrivateAttr(default_factory=set)
    """Session ids this tool created (and deletes on close)."""
    _client: Client | None = PrivateAttr(default=None)
    _sync_sessions: dict[str, Session] = PrivateAttr(default_factory=dict)
    _alocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = PrivateAttr(
        default_factory=weakref.WeakKeyDictionary
    )

    # ------------------------------------------------------------------ keys

    def _key(self, config: RunnableConfig | None) -> str:
        if self.per_thread and config:
            configurable = config.get("configurable") or {}
            thread_id = configurable.get("thread_id") if isinstance(configurable, Mapping) else None
            if thread_id is not None:
                return str(thread_id)
        return _DEFAULT_KEY

    def _existing_id(self, key: str) -> str | None:
        if key == _DEFAULT_KEY and self.session_id is not None:
            return self.session_id
        return self._ids.get(key)

    def sessions(self) -> dict[str | None, str]:
        """The sessions in use: thread id (None: calls without one) -> session id."""
        out: dict[str | None, str] = {None if k == _DEFAULT_KEY else k: v for k, v in self._ids.items()}
        if self.session_id is not None:
            out[None] = self.session_id
        return out

    # ------------------------------------------------------------------ sync

    def _sync_client(self) -> Client:
        if self._client is None:
            self._client = Client(self.base_url, headers=self.headers)
        return self._client

    def _sync_session(self, key: str) -> Session:
        with self._lock:
            session = self._sync_sessions.get(key)
            if session is not None:
                return session
            client = self._sync_client()
            sid = self._existing_id(key)
            if sid is None:
                session = client.create_session(**self.session_options)
                self._ids[key] = session.id
                self._owned.add(session.id)
            else:
                session = client.get_session(sid)
            self._sync_sessions[key] = session
            return session

    def _run(
        self,
        code: str,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        key = self._key(config)
        session = self._sync_session(key)
        try:
            execution = session.run(code, timeout=self.timeout)
            note = None
        except ClientError as exc:
            if not self._ended(exc, key, session.id):
                raise
            session = self._sync_session(key)
            execution, note = session.run(code, timeout=self.timeout), ENDED_NOTE
        return self._answer(session.id, self._observe(execution), note)

    # ----------------------------------------------------------------- async

    def _async_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        with self._lock:
            lock = self._alocks.get(loop)
            if lock is None:
                lock = self._alocks[loop] = asyncio.Lock()
            return lock

    async def _async_session_id(self, client: AsyncClient, key: str) -> str:
        async with self._async_lock():  # parallel tool calls of one conversation: one session
            sid = self._existing_id(key)
            if sid is None:
                session = await client.create_session(**self.session_options)
                with self._lock:
                    self._ids[key] = sid = session.id
                    self._owned.add(sid)
            return sid

    async def _arun(
        self,
        code: str,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        # An HTTP client per call: httpx's async pool belongs to one event loop,
        # and a tool may be called from several (asyncio.run per request).
        key = self._key(config)
        async with AsyncClient(self.base_url, headers=self.headers) as client:
            sid = await self._async_session_id(client, key)
            try:
                execution = await AsyncSession(client, _info(sid)).run(code, timeout=self.timeout)
                note = None
            except ClientError as exc:
                if not self._ended(exc, key, sid):
                    raise
                sid = await self._async_session_id(client, key)
                execution = await AsyncSession(client, _info(sid)).run(code, timeout=self.timeout)
                note = ENDED_NOTE
        return self._answer(sid, self._observe(execution), note)

    # ---------------------------------------------------------------- shared

    def _observe(self, execution: Any) -> Observation:
        return observe(
            execution,
            max_chars=self.max_chars,
            max_section_chars=self.max_section_chars,
            traceback_frames=self.traceback_frames,
        )

    def _ended(self, exc: ClientError, key: str, session_id: str) -> bool:
        """True when the gateway ended a session this tool created (its idle timeout,
        a gateway restart); then it is forgotten, and the next call makes a new one."""
        if exc.status_code != 404 or exc.code != "session_not_found":
            return False
        with self._lock:
            if session_id not in self._owned:
                return False  # the application's session (session_id=...): its business
            self._owned.discard(session_id)
            if self._ids.get(key) == session_id:
                del self._ids[key]
            self._sync_sessions.pop(key, None)
        return True

    def _answer(self, session_id: str, observation: Observation, note: str | None = None) -> tuple[Any, dict[str, Any]]:
        artifact = observation.artifact(session_id=session_id)
        text = f"{note}\n{observation.text}" if note else observation.text
        if self.images_in_content and observation.images:
            content: Any = [{"type": "text", "text": text}] + [
                {"type": "image", "base64": image.data, "mime_type": image.mime_type} for image in observation.images
            ]
            return content, artifact
        return text, artifact

    # --------------------------------------------------------------- closing

    def _forget(self, thread_id: str | None) -> list[str]:
        """Drop the bookkeeping of one conversation (or all); the owned ids to delete."""
        with self._lock:
            keys = list(self._ids) if thread_id is None else [str(thread_id)]
            doomed = [self._ids.pop(k) for k in keys if k in self._ids]
            for k in keys:
                self._sync_sessions.pop(k, None)
            if thread_id is None:
                self._sync_sessions.clear()
            owned = [sid for sid in doomed if sid in self._owned]
            self._owned.difference_update(owned)
            return owned

    def close(self, thread_id: str | None = None) -> None:
        """Delete the sessions this tool created (only ``thread_id``'s when given);
        with no thread id, also close the HTTP client. Later calls start new sessions."""
        doomed = self._forget(thread_id)
        if doomed:
            client = self._sync_client()
            for sid in doomed:
                _delete(client, sid)
        if thread_id is None and self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self, thread_id: str | None = None) -> None:
        """`close` for async code."""
        doomed = self._forget(thread_id)
        if doomed:
            async with AsyncClient(self.base_url, headers=self.headers) as client:
                for sid in doomed:
                    await _adelete(client, sid)
        if thread_id is None and self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> KernelGWTool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> KernelGWTool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _delete(client: Client, session_id: str) -> None:
    Session(client, _info(session_id)).delete(missing_ok=True)


async def _adelete(client: AsyncClient, session_id: str) -> None:
    await AsyncSession(client, _info(session_id)).delete(missing_ok=True)


def _info(session_id: str) -> Any:
    from kernelgw.client import SessionInfo

    return SessionInfo(id=session_id, state="idle")
