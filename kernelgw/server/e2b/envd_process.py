"""envd's process service (``process.Process``, Connect RPC): a sandbox's commands.

E2B's SDK runs ``sandbox.commands.run(cmd)`` as ``Start`` of ``/bin/bash -l
-c <cmd>`` (the kernel image has bash), a server-streaming call whose events
are the start (with the pid), the output (stdout and stderr, base64 bytes in
proto3 JSON), keepalives and the end (exit code, status, error). ``Connect``
attaches to a running command again (from any client holding the sandbox's
token: what the command printed and the ring still holds comes first);
``List``, ``SendInput``, ``CloseStdin`` and ``SendSignal`` are unary.

Each command is a `kernelgw.runtime.commands.Command`: a process in the
sandbox's container as its one user, inside its limits, with no network; its
environment is the sandbox's (create-time ``envs``, the kernel's) plus the
call's ``envs`` under kernelgw's rule for them (`kernelgw.models.check_env`:
no PATH or LD_*), its working directory ``/home/user`` (the workspace) or a
``cwd`` within it. The call's deadline (the SDK's ``timeout``, 60 s by
default) kills a started command, and its end says so; a deadline on
``Connect`` only ends that stream. ``user="root"`` is refused: kernelgw's
sandboxes have no root. The terminal (``pty``, ``Update``) and
``StreamInput`` are not served (``unimplemented``, naming the gap).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import signal
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from kernelgw.errors import KernelGWError
from kernelgw.models import check_env
from kernelgw.runtime.backends.base import WORKSPACE_DIR
from kernelgw.runtime.commands import Command as RunningCommand
from kernelgw.runtime.commands import (
    CommandConfig,
    CommandNotFound,
    CommandRegistry,
    End,
    Output,
    TooManyCommands,
)
from kernelgw.server.e2b.connect import (
    STREAM_CONTENT_TYPE,
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
    HOME,
    USER,
    ConnectRoute,
    Empty,
    basic_user,
    connect_error,
    sandbox_path,
    workspace_files,
    workspace_of,
    workspace_path,
)
from kernelgw.server.e2b.sandbox import ENVD_PORT, Sandbox, sandbox_for
from kernelgw.server.state import gateway_state

KEEPALIVE_HEADER = "keepalive-ping-interval"
DEFAULT_KEEPALIVE_S = 50.0
"""The SDK asks for 50 s (``Keepalive-Ping-Interval``)."""
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM, 9: signal.SIGKILL, 15: signal.SIGTERM}
_REGISTRY = "kernelgw_e2b_commands"


# ---------------------------------------------------------------- messages


class ProcessConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cmd: StrictStr = ""
    args: list[StrictStr] = []
    envs: dict[StrictStr, StrictStr] = {}
    cwd: StrictStr | None = None


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    process: ProcessConfig = ProcessConfig()
    pty: dict[str, Any] | None = None
    tag: StrictStr | None = None
    stdin: StrictBool | None = None


class Selector(BaseModel):
    model_config = ConfigDict(extra="ignore")

    pid: StrictInt | StrictStr | None = None
    tag: StrictStr | None = None


class SelectRequest(BaseModel):
    """``ConnectRequest``, ``CloseStdinRequest``."""

    model_config = ConfigDict(extra="ignore")

    process: Selector = Selector()


class ProcessInput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    stdin: StrictStr | None = None
    pty: StrictStr | None = None


class SendInputRequest(SelectRequest):
    input: ProcessInput = ProcessInput()


class SendSignalRequest(SelectRequest):
    signal: StrictStr | StrictInt = "SIGNAL_UNSPECIFIED"


# ---------------------------------------------------------------- events (pure)


def start_event(pid: int) -> dict[str, Any]:
    return {"event": {"start": {"pid": pid}}}


def keepalive_event() -> dict[str, Any]:
    return {"event": {"keepalive": {}}}


def output_event(output: Output) -> dict[str, Any]:
    """Output as envd's ``DataEvent``: bytes are base64 in proto3 JSON."""
    name = "stdout" if output.stream == 1 else "stderr"
    return {"event": {"data": {name: base64.b64encode(output.data).decode("ascii")}}}


def end_event(end: End) -> dict[str, Any]:
    body: dict[str, Any] = {"exitCode": end.exit_code, "exited": end.exited, "status": end.status}
    if end.error is not None:
        body["error"] = end.error
    return {"event": {"end": body}}


def event_of(item: Output | End | None) -> dict[str, Any]:
    if item is None:
        return keepalive_event()
    if isinstance(item, End):
        return end_event(item)
    return output_event(item)


def process_info(command: RunningCommand) -> dict[str, Any]:
    c = command.config
    info: dict[str, Any] = {"config": {"cmd": c.cmd, "args": c.args, "envs": c.envs, "cwd": c.cwd}, "pid": command.pid}
    if c.tag is not None:
        info["tag"] = c.tag
    return info


def signal_of(value: str | int) -> int:
    found = SIGNALS.get(value)
    if found is None:
        raise ConnectError(
            "invalid_argument", f"signal {value!r} is not one envd sends (SIGNAL_SIGKILL, SIGNAL_SIGTERM)"
        )
    return int(found)


def keepalive_s(request: Request) -> float:
    text = request.headers.get(KEEPALIVE_HEADER, "").strip()
    seconds = float(text) if text.isdigit() else DEFAULT_KEEPALIVE_S
    return min(max(seconds, 1.0), 300.0)


# ---------------------------------------------------------------- the registry


def registry(request: Request) -> CommandRegistry:
    """The gateway's commands (made on first use, kept on the app)."""
    app_state = request.app.state
    found = getattr(app_state, _REGISTRY, None)
    if not isinstance(found, CommandRegistry):
        found = CommandRegistry(gateway_state(request).backend)
        setattr(app_state, _REGISTRY, found)
    return found


def check_command_user(authorization: str | None) -> None:
    user = basic_user(authorization)
    if user and user != USER:
        raise ConnectError(
            "permission_denied",
            f"user={user!r}: kernelgw's sandboxes run commands as their one unprivileged user, {USER!r} "
            "(there is no root, nor sudo); leave the user out",
        )


def select(request: Request, sandbox: Sandbox, selector: Selector) -> RunningCommand:
    commands = registry(request)
    try:
        if selector.pid is not None:
            try:
                pid = int(selector.pid)
            except ValueError:
                raise ConnectError("invalid_argument", f"pid must be a number, not {selector.pid!r}") from None
            return commands.get(sandbox.id, pid)
        if selector.tag is not None:
            for command in commands.commands(sandbox.id):
                if command.config.tag == selector.tag:
                    return command
            raise CommandNotFound(f"process with tag {selector.tag!r} not found")
    except CommandNotFound as exc:
        raise ConnectError("not_found", exc.message) from None
    raise ConnectError("invalid_argument", "process: give a pid (or a tag)")


# ---------------------------------------------------------------- streams


def stream(request: Request, command: RunningCommand, *, deadline_s: float | None) -> Response:
    """The events of ``command`` from now on (what the ring holds first), ended
    by its end, or by ``deadline_exceeded`` when ``deadline_s`` passes first."""
    interval = keepalive_s(request)

    async def body() -> AsyncIterator[bytes]:
        yield envelope(start_event(command.pid))
        watching = command.watch(interval)
        try:
            async with asyncio.timeout(deadline_s):
                async for item in watching:
                    yield envelope(event_of(item))
                    if isinstance(item, End):
                        break
        except TimeoutError:
            error = ConnectError("deadline_exceeded", f"The call did not end within its deadline ({deadline_s:g} s)")
            yield end_envelope(error)
            return
        finally:
            await watching.aclose()
        yield end_envelope()

    return StreamingResponse(body(), media_type=STREAM_CONTENT_TYPE)


async def start(request: Request, sandbox: Sandbox) -> Response:
    msg = await read_stream_message(request, StartRequest)
    if msg.pty is not None:
        raise ConnectError(
            "unimplemented",
            "A terminal (sandbox.pty) is not served by kernelgw yet; run commands with sandbox.commands.run",
        )
    config = msg.process
    if not config.cmd:
        raise ConnectError("invalid_argument", "process.cmd is empty: name the program to run")
    try:
        env = check_env(config.envs)
    except ValueError as exc:
        raise ConnectError("invalid_argument", f"envs: {exc}") from None
    rel = workspace_path(config.cwd) if config.cwd else ""
    handle = await workspace_of(request, sandbox)
    if rel:
        entry = await workspace_files(request).stat(handle, rel)
        if entry.type != "directory":
            raise ConnectError("invalid_argument", f"cwd {sandbox_path(rel)} is not a directory")
    deadline = timeout_s(request)
    try:
        command = await registry(request).start(
            sandbox.id,
            handle,
            [config.cmd, *config.args],
            CommandConfig(config.cmd, list(config.args), dict(config.envs), config.cwd or HOME, msg.tag),
            env={"PWD": sandbox_path(rel), **env},  # the shell's pwd names /home/user, as E2B's
            cwd=f"{WORKSPACE_DIR}/{rel}" if rel else WORKSPACE_DIR,
            stdin=bool(msg.stdin),
            timeout_s=deadline,
        )
    except TooManyCommands as exc:
        raise ConnectError("resource_exhausted", exc.message) from None
    sandbox.session.touch()
    # the command's timeout ends it (and says so in its end): the stream waits for that end
    return stream(request, command, deadline_s=None)


async def connect(request: Request, sandbox: Sandbox) -> Response:
    msg = await read_stream_message(request, SelectRequest)
    command = select(request, sandbox, msg.process)
    return stream(request, command, deadline_s=timeout_s(request))


# ---------------------------------------------------------------- unary calls


async def list_call(request: Request, sandbox: Sandbox) -> dict[str, Any]:
    await read_message(request, Empty)
    running = [c for c in registry(request).commands(sandbox.id) if c.running]
    return {"processes": [process_info(c) for c in sorted(running, key=lambda c: c.pid)]}


async def send_input_call(request: Request, sandbox: Sandbox) -> dict[str, Any]:
    msg = await read_message(request, SendInputRequest)
    command = select(request, sandbox, msg.process)
    if msg.input.pty is not None:
        raise ConnectError("unimplemented", "A terminal (sandbox.pty) is not served by kernelgw yet")
    try:
        data = base64.b64decode(msg.input.stdin or "", validate=True)
    except binascii.Error:
        raise ConnectError("invalid_argument", "input.stdin is not base64") from None
    await write_stdin(command, data)
    return {}


async def write_stdin(command: RunningCommand, data: bytes) -> None:
    if not command.stdin:
        raise ConnectError(
            "failed_precondition", f"process {command.pid} was started without stdin: start it with stdin=True"
        )
    if not command.running:
        raise ConnectError("not_found", f"process with pid {command.pid} has ended")
    try:
        await command.process.write(data)
    except KernelGWError as exc:
        raise ConnectError("failed_precondition", f"process {command.pid}: {exc.message}") from None


async def close_stdin_call(request: Request, sandbox: Sandbox) -> dict[str, Any]:
    msg = await read_message(request, SelectRequest)
    command = select(request, sandbox, msg.process)
    if command.stdin and command.running:
        try:
            await command.process.close_stdin()
        except KernelGWError as exc:
            raise ConnectError("failed_precondition", f"process {command.pid}: {exc.message}") from None
    return {}


async def send_signal_call(request: Request, sandbox: Sandbox) -> dict[str, Any]:
    msg = await read_message(request, SendSignalRequest)
    signum = signal_of(msg.signal)
    command = select(request, sandbox, msg.process)
    if not command.running:
        raise ConnectError("not_found", f"process with pid {command.pid} has ended")
    await command.signal(signum, "killed by sandbox.commands.kill (SIGKILL)" if signum == signal.SIGKILL else None)
    return {}


class _Dict(BaseModel):
    """A unary answer already in proto3 JSON."""

    model_config = ConfigDict(extra="allow")


UNARY = {
    "List": list_call,
    "SendInput": send_input_call,
    "CloseStdin": close_stdin_call,
    "SendSignal": send_signal_call,
}
UNSERVED = {
    "Update": "Resizing a terminal (sandbox.pty.resize) is not served: kernelgw has no terminal yet",
    "StreamInput": "Streaming stdin (sandbox.commands.stream_input) is not served; send it with send_stdin",
}

router = APIRouter(route_class=ConnectRoute, tags=["e2b"])


@router.post("/e2b/process.Process/{method}")
async def process(method: str, request: Request) -> Response:
    """One call of envd's process service (port 49983) on the sandbox's commands."""
    sandbox = await sandbox_for(request, ENVD_PORT)
    check_command_user(request.headers.get("authorization"))
    try:
        if method == "Start":
            return await start(request, sandbox)
        if method == "Connect":
            return await connect(request, sandbox)
        call = UNARY.get(method)
        if call is None:
            raise ConnectError("unimplemented", UNSERVED.get(method, f"process.Process has no method {method}"))
        answer = await within_deadline(request, _as_model(call(request, sandbox)))
    except CommandNotFound as exc:
        raise ConnectError("not_found", exc.message) from None
    except KernelGWError as exc:
        raise connect_error(exc) from None
    return message_response(answer)


async def _as_model(work: Any) -> _Dict:
    return _Dict.model_validate(await work)
