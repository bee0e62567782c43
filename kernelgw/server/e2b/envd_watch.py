"""envd's directory watching: ``filesystem.Filesystem/WatchDir`` (a server
stream) and the polling trio ``CreateWatcher``, ``GetWatcherEvents``,
``RemoveWatcher`` (E2B's ``sandbox.files.watch_dir``: the async SDK streams,
the sync one polls).

A watch is the image's watch helper (`kernelgw.runtime.workspace.watch_dir`)
in the sandbox's container: the directory opened under the workspace's path
rules, inotify on it (a watch per subdirectory when ``recursive``), one JSON
line per change, which this module turns into envd's ``FilesystemEvent``:
``name`` relative to the watched directory, ``type`` one of envd's
``EVENT_TYPE_*``, and with ``include_entry`` the entry of a create, write or
mode change. Paths outside ``/home/user`` are ``permission_denied``, a missing
directory ``not_found``, a file or a link ``invalid_argument``.

Bounded: a sandbox has at most `MAX_WATCHERS` watches (streams and watchers
together; then ``resource_exhausted``); each keeps at most `MAX_EVENTS` events
not yet read, and a watch that falls that far behind ends with an error that
says so (never dropping events silently); a watcher nobody polls for
`IDLE_S` is removed. A watch ends with its sandbox's kernel: killed, paused,
its timeout run out or restarted, the container goes and the helper with it;
the stream's end (or the next poll) says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from kernelgw.errors import FileNotFoundInWorkspace, InvalidPath, KernelGWError
from kernelgw.runtime.backends.base import KernelHandle
from kernelgw.runtime.session import KernelSession
from kernelgw.runtime.workspace import DirWatch, entry_details, watch_dir
from kernelgw.server.e2b.connect import (
    STREAM_CONTENT_TYPE,
    Code,
    ConnectError,
    end_envelope,
    envelope,
    message_response,
    read_message,
    read_stream_message,
    timeout_s,
    within_deadline,
)
from kernelgw.server.e2b.envd import (
    ConnectRoute,
    Empty,
    basic_user,
    check_user,
    clean,
    connect_error,
    entry_info,
    sandbox_path,
    workspace_of,
    workspace_path,
)
from kernelgw.server.e2b.envd_process import keepalive_s
from kernelgw.server.e2b.sandbox import ENVD_PORT, Sandbox, sandbox_for
from kernelgw.server.state import GatewayState, gateway_state

log = logging.getLogger(__name__)

MAX_WATCHERS = 16
"""Watches (streams and polled watchers) one sandbox has at once."""
MAX_EVENTS = 10_000
"""Events a watch keeps that nobody has read yet; past that it ends, saying so."""
IDLE_S = 600.0
"""A polled watcher nobody asked for events this long is removed."""
CHECK_S = 1.0
"""How often a watch checks that its sandbox's kernel is still the one it watches in."""
ENDED_GRACE_S = 60.0
"""How long a polled watcher that ended stays for its poller to learn why."""
EVENT_TYPES = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}
ENDS: dict[str, tuple[Code, str]] = {
    "gone": ("not_found", "{path} was removed or moved away: its watch ended; watch it again once it is back"),
    "overflow": (
        "failed_precondition",
        "{path} changed faster than the sandbox's kernel queues changes for a watch; events were lost and the "
        "watch ended: watch it again and list it to catch up",
    ),
    "too_many": ("failed_precondition", "{message}: the watch of {path} ended"),
}
"""How a watch the helper ended ends, by the helper's code."""


# ---------------------------------------------------------------- messages


class WatchRequest(BaseModel):
    """``WatchDirRequest`` and ``CreateWatcherRequest``."""

    model_config = ConfigDict(extra="ignore")

    path: StrictStr = ""
    recursive: StrictBool = False
    include_entry: StrictBool = Field(False, alias="includeEntry")
    allow_network_mounts: StrictBool = Field(False, alias="allowNetworkMounts")
    """A sandbox's workspace is never a network mount: taken, nothing to allow."""


class WatcherRequest(BaseModel):
    """``GetWatcherEventsRequest`` and ``RemoveWatcherRequest``."""

    model_config = ConfigDict(extra="ignore")

    watcher_id: StrictStr = Field("", alias="watcherId")


def filesystem_event(line: dict[str, Any]) -> dict[str, Any] | None:
    """A helper's event line as envd's ``FilesystemEvent`` in proto3 JSON (None: not one)."""
    kind = EVENT_TYPES.get(str(line.get("type")))
    if kind is None:
        return None
    event: dict[str, Any] = {"name": clean(str(line.get("name", ""))), "type": kind}
    entry = line.get("entry")
    if isinstance(entry, dict):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            event["entry"] = entry_info(entry_details(entry)).model_dump(by_alias=True, exclude_none=True)
    return event


# ---------------------------------------------------------------- watchers


@dataclass(eq=False)
class Watcher:
    """One running watch of a sandbox's directory and the events not yet read."""

    id: str
    sandbox_id: str
    path: str
    """The watched directory, as the sandbox names it."""
    session: KernelSession
    handle: KernelHandle
    watch: DirWatch
    polled: bool
    """A ``CreateWatcher``'s (polled), not a stream's."""
    mode: str = ""
    """How the helper watches: ``inotify``, or ``poll`` where inotify is missing."""
    max_events: int = MAX_EVENTS
    idle_s: float = IDLE_S
    events: deque[dict[str, Any]] = field(default_factory=deque)
    error: ConnectError | None = None
    ended: bool = False
    last_read: float = field(default_factory=time.monotonic)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    removed: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    idled: bool = False
    """Removed because nobody polled it: gone at once."""

    def take(self) -> list[dict[str, Any]]:
        """The events not read yet (now read)."""
        self.last_read = time.monotonic()
        taken = list(self.events)
        self.events.clear()
        self.changed.clear()
        return taken

    async def end(self, error: ConnectError | None) -> None:
        """Stop the helper; the error (None: stopped by its client) comes after the events kept."""
        if not self.ended:
            self.ended = True
            self.error = error
            self.changed.set()
        try:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self.watch.close()
        finally:
            self.stopped.set()

    async def pump(self) -> None:
        """Keep the helper's events until it ends, or the events overflow."""
        try:
            while (line := await self.watch.line()) is not None:
                if line.get("ok") is False:
                    code, message = ENDS.get(str(line.get("error")), ("internal", "{message}"))
                    text = message.format(path=self.path, message=str(line.get("message", "")))
                    await self.end(ConnectError(code, text))
                    return
                event = filesystem_event(line)
                if event is None:
                    continue
                if len(self.events) >= self.max_events:
                    await self.end(
                        ConnectError(
                            "failed_precondition",
                            f"More than {self.max_events} changes of {self.path} came before they were read (the "
                            "directory changes faster than its events are read, or nobody polls): the watch "
                            "ended after the events it kept; watch it again and list it to catch up",
                        )
                    )
                    return
                self.events.append(event)
                self.changed.set()
        except KernelGWError as exc:
            await self.end(connect_error(exc))
            return
        await self.end(self.gone() or ConnectError("internal", self.helper_ended()))

    def helper_ended(self) -> str:
        detail = self.watch.stderr.splitlines()[-1:] or ["no output"]
        return f"The watch of {self.path} ended: its helper in the sandbox stopped ({detail[0]})"

    def gone(self) -> ConnectError | None:
        """Why the watch cannot go on, when its kernel is no longer the sandbox's."""
        if self.session.state in ("paused", "closed", "dead") or self.session.handle is not self.handle:
            return ConnectError(
                "unavailable",
                f"The sandbox was paused, killed or restarted (or its timeout ran out), and the watch of "
                f"{self.path} ended with it; watch again once it runs",
            )
        return None

    async def guard(self) -> None:
        """End the watch when its kernel goes (a container the engine keeps a
        moment longer, or a backend whose helpers outlive it) or, polled, when
        nobody polls it."""
        while not self.ended:
            await asyncio.sleep(CHECK_S)
            reason = self.gone()
            if reason is None and self.polled and time.monotonic() - self.last_read > self.idle_s:
                self.idled = True
                reason = ConnectError(
                    "not_found", f"watcher {self.id} was removed: nobody polled it for {self.idle_s:g} s"
                )
            if reason is not None:
                await self.end(reason)


class WatcherRegistry:
    """Every sandbox's watches, by sandbox id and watcher id."""

    def __init__(
        self,
        *,
        max_watchers: int = MAX_WATCHERS,
        max_events: int = MAX_EVENTS,
        idle_s: float = IDLE_S,
        grace_s: float = ENDED_GRACE_S,
    ) -> None:
        self.max_watchers = max_watchers
        self.max_events = max_events
        self.idle_s = idle_s
        self.grace_s = grace_s
        self._sandboxes: dict[str, dict[str, Watcher]] = {}
        self._starting: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def watchers(self, sandbox_id: str) -> list[Watcher]:
        return list(self._sandboxes.get(sandbox_id, {}).values())

    def get(self, sandbox_id: str, watcher_id: str) -> Watcher:
        found = self._sandboxes.get(sandbox_id, {}).get(watcher_id)
        if found is None:
            raise ConnectError(
                "not_found", f"watcher with id {watcher_id} not found (removed, or not polled for {self.idle_s:g} s)"
            )
        return found

    async def start(
        self, request: Request, sandbox: Sandbox, msg: WatchRequest, *, polled: bool, timeout: float
    ) -> Watcher:
        rel = workspace_path(msg.path)
        path = sandbox_path(rel)
        if len(self.watchers(sandbox.id)) + self._starting.get(sandbox.id, 0) >= self.max_watchers:
            raise ConnectError(
                "resource_exhausted",
                f"This sandbox has {self.max_watchers} watches, the most it may at once; stop one "
                "(handle.stop()) first",
            )
        self._starting[sandbox.id] = self._starting.get(sandbox.id, 0) + 1  # its slot, while it starts
        try:
            handle = await workspace_of(request, sandbox)
            watch, mode = await watch_dir(
                gateway_state(request).backend,
                handle,
                rel,
                recursive=msg.recursive,
                entries=msg.include_entry,
                timeout=timeout,
            )
        except FileNotFoundInWorkspace as exc:
            raise ConnectError("not_found", f"path {path} not found: {exc.message}") from None
        except InvalidPath as exc:
            raise ConnectError("invalid_argument", f"path {path} cannot be watched: {exc.message}") from None
        finally:
            left = self._starting.pop(sandbox.id, 1) - 1
            if left:
                self._starting[sandbox.id] = left
        watcher = Watcher(
            "w" + secrets.token_hex(8),
            sandbox.id,
            path,
            sandbox.session,
            handle,
            watch,
            polled,
            mode=mode,
            max_events=self.max_events,
            idle_s=self.idle_s,
        )
        self._sandboxes.setdefault(sandbox.id, {})[watcher.id] = watcher
        self._spawn(self._run(watcher))
        sandbox.session.touch()
        return watcher

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, watcher: Watcher) -> None:
        try:
            loop = asyncio.get_running_loop()
            tasks = {loop.create_task(watcher.pump()), loop.create_task(watcher.guard())}
            stopped = loop.create_task(watcher.stopped.wait())
            try:
                await asyncio.wait({*tasks, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (*tasks, stopped):
                    task.cancel()
                await asyncio.gather(*tasks, stopped, return_exceptions=True)
            if watcher.polled and not watcher.idled:
                # its end stays for its poller to read (which removes it), a while
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.grace_s):
                        await watcher.removed.wait()
        finally:
            self.discard(watcher)
            await watcher.end(None)

    def has(self, watcher: Watcher) -> bool:
        return self._sandboxes.get(watcher.sandbox_id, {}).get(watcher.id) is watcher

    def discard(self, watcher: Watcher) -> None:
        watcher.removed.set()
        found = self._sandboxes.get(watcher.sandbox_id, {})
        if found.get(watcher.id) is watcher:
            del found[watcher.id]
            if not found:
                self._sandboxes.pop(watcher.sandbox_id, None)

    async def remove(self, watcher: Watcher) -> None:
        self.discard(watcher)
        await watcher.end(None)

    async def close(self) -> None:
        """End every watch (the gateway is stopping)."""
        for watchers in list(self._sandboxes.values()):
            for watcher in list(watchers.values()):
                await self.remove(watcher)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


REGISTRIES: weakref.WeakKeyDictionary[GatewayState, WatcherRegistry] = weakref.WeakKeyDictionary()
"""Each gateway's watches (made on first use), by its state."""


def registry(request: Request) -> WatcherRegistry:
    """The gateway's watches."""
    state = gateway_state(request)
    found = REGISTRIES.get(state)
    if found is None:
        found = REGISTRIES[state] = WatcherRegistry()
    return found


def helper_timeout(request: Request) -> float:
    return float(gateway_state(request).workspace_files.timeout)


# ---------------------------------------------------------------- the calls


async def watch_dir_call(request: Request, sandbox: Sandbox) -> Response:
    """``WatchDir``: a start event, then the directory's events and keepalives,
    until the client goes, the call's deadline passes or the watch ends."""
    msg = await read_stream_message(request, WatchRequest)
    watchers = registry(request)
    deadline = timeout_s(request)
    started = time.monotonic()
    watcher = await watchers.start(
        request, sandbox, msg, polled=False, timeout=min(helper_timeout(request), deadline or float("inf"))
    )
    interval = keepalive_s(request)

    async def body() -> AsyncIterator[bytes]:
        try:
            yield envelope({"start": {}})
            left = None if deadline is None else max(0.0, deadline - (time.monotonic() - started))
            try:
                async with asyncio.timeout(left):
                    while True:
                        for event in watcher.take():
                            yield envelope({"filesystem": event})
                        if watcher.ended:
                            break
                        try:
                            async with asyncio.timeout(interval):
                                await watcher.changed.wait()
                        except TimeoutError:
                            yield envelope({"keepalive": {}})
            except TimeoutError:
                error = ConnectError("deadline_exceeded", f"The call did not end within its deadline ({deadline:g} s)")
                yield end_envelope(error)
                return
            yield end_envelope(watcher.error)
        finally:
            await watchers.remove(watcher)

    return StreamingResponse(body(), media_type=STREAM_CONTENT_TYPE)


async def create_watcher_call(request: Request, sandbox: Sandbox) -> BaseModel:
    msg = await read_message(request, WatchRequest)
    watcher = await registry(request).start(request, sandbox, msg, polled=True, timeout=helper_timeout(request))
    return _Answer.model_validate({"watcherId": watcher.id})


async def get_watcher_events_call(request: Request, sandbox: Sandbox) -> BaseModel:
    """The events since the last poll; once they are read, the error the watch
    ended with (and the watcher is gone)."""
    msg = await read_message(request, WatcherRequest)
    watchers = registry(request)
    watcher = watchers.get(sandbox.id, msg.watcher_id)
    events = watcher.take()
    if not events and watcher.ended:
        await watchers.remove(watcher)
        if watcher.error is not None:
            raise watcher.error
    return _Answer.model_validate({"events": events})


async def remove_watcher_call(request: Request, sandbox: Sandbox) -> BaseModel:
    msg = await read_message(request, WatcherRequest)
    watchers = registry(request)
    await watchers.remove(watchers.get(sandbox.id, msg.watcher_id))
    return Empty()


class _Answer(BaseModel):
    """A unary answer already in proto3 JSON."""

    model_config = ConfigDict(extra="allow")


UNARY = {
    "CreateWatcher": create_watcher_call,
    "GetWatcherEvents": get_watcher_events_call,
    "RemoveWatcher": remove_watcher_call,
}

router = APIRouter(route_class=ConnectRoute, tags=["e2b"])
"""Matched before envd's other filesystem calls (`kernelgw.server.e2b.envd`'s ``{method}`` route)."""


@router.post("/e2b/filesystem.Filesystem/WatchDir")
async def watch_dir_route(request: Request) -> Response:
    """Watch a directory of the sandbox (envd's server stream, port 49983)."""
    sandbox = await sandbox_for(request, ENVD_PORT)
    check_user(basic_user(request.headers.get("authorization")))
    return await watch_dir_call(request, sandbox)


def _polled(name: str, call: Callable[[Request, Sandbox], Awaitable[BaseModel]]) -> None:
    async def route(request: Request) -> Response:
        sandbox = await sandbox_for(request, ENVD_PORT)
        check_user(basic_user(request.headers.get("authorization")))
        return message_response(await within_deadline(request, call(request, sandbox)))

    route.__doc__ = f"``{name}``: a watch the client polls (envd, port 49983)."
    router.add_api_route(
        f"/e2b/filesystem.Filesystem/{name}", route, methods=["POST"], name=name, operation_id=f"e2b_envd_{name}"
    )


for _name, _call in UNARY.items():
    _polled(_name, _call)
