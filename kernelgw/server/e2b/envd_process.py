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
``Connect`` only ends that stream. ``user="root"`` is refused unless the
gateway allows it (``e2b_root_commands``) and the sandbox runs under gVisor. ``stdin`` absent from ``Start`` opens it, as envd
does (the SDK always says).

A terminal (``sandbox.pty``) is a ``Start`` with ``pty.size``: the same kind
of command, run with a tty of that size (``docker exec -t``); its output is
``pty`` data, its input ``SendInput``'s ``input.pty``, and ``Update`` with
``pty.size`` resizes it. ``StreamInput`` (client streaming: a start naming
the process, then input, keepalives) writes each input as it arrives.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import signal
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from kernelgw.errors import KernelGWError
from kernelgw.models import check_env
from kernelgw.runtime.backends.base import WORKSPACE_DIR, TerminalSize
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
    client_stream,
    end_envelope,
    envelope,
    message_response,
    parse_message,
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
MAX_TERMINAL_SIDE = 65535
"""A terminal's rows and columns are 16-bit (the kernel's ``winsize``)."""
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM, 9: signal.SIGKILL, 15: signal.SIGTERM}
_REGISTRY = "kernelgw_e2b_commands"


# ---------------------------------------------------------------- messages


class ProcessConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cmd: StrictStr = ""
    args: list[StrictStr] = []
    envs: dict[StrictStr, StrictStr] = {}
    cwd: StrictStr | None = None


class PtySize(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rows: StrictInt = 0
    cols: StrictInt = 0


class Pty(BaseModel):
    model_config = ConfigDict(extra="ignore")

    size: PtySize = PtySize()


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    process: ProcessConfig = ProcessConfig()
    pty: Pty | None = None
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


class UpdateRequest(SelectRequest):
    pty: Pty | None = None


class StreamInputStart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    process: Selector = Selector()


class StreamInputData(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: ProcessInput = ProcessInput()


class StreamInputRequest(BaseModel):
    """One message of ``StreamInput``: exactly one of its events."""

    model_config = ConfigDict(extra="ignore")

    start: StreamInputStart | None = None
    data: StreamInputData | None = None
    keepalive: dict[str, Any] | None = None


# ---------------------------------------------------------------- events (pure)


def start_event(pid: int) -> dict[str, Any]:
    return {"event": {"start": {"pid": pid}}}


def keepalive_event() -> dict[str, Any]:
    return {"event": {"keepalive": {}}}


STREAM_NAMES = {1: "stdout", 2: "stderr", 3: "pty"}


def output_event(output: Output) -> dict[str, Any]:
    """Output as envd's ``DataEvent``: bytes are base64 in proto3 JSON."""
    name = STREAM_NAMES[output.stream]
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


def terminal_size(pty: Pty) -> TerminalSize:
    rows, cols = pty.size.rows, pty.size.cols
    if not (1 <= rows <= MAX_TERMINAL_SIDE and 1 <= cols <= MAX_TERMINAL_SIDE):
        raise ConnectError(
            "invalid_argument",
            f"pty.size: rows and cols must each be 1 to {MAX_TERMINAL_SIDE} (got rows={rows}, cols={cols})",
        )
    return TerminalSize(rows, cols)


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


def command_user_is_root(request: Request, sandbox: Sandbox) -> bool:
    """Whether the call names root (E2B's ``user="root"``), which only a gateway
    with ``e2b_root_commands`` allows, and only in a gVisor sandbox; any other
    user than the sandbox's own is refused."""
    user = basic_user(request.headers.get("authorization"))
    return check_command_user(user, gateway_state(request).settings.e2b_root_commands, sandbox.session.spec.runtime)


async def close_commands(app: FastAPI) -> None:
    """Stop reading the gateway's commands (it is stopping): their connections
    to the engine close, as they would when the process exits."""
    found = getattr(app.state, _REGISTRY, None)
    if isinstance(found, CommandRegistry):
        await found.close()


def check_command_user(user: str | None, root_allowed: bool, runtime: str) -> bool:
    """True for root where it may run; False for the sandbox's own user (named
    or not); `ConnectError` ``permission_denied`` saying why for anyone else."""
    if not user or user == USER:
        return False
    if user != "root":
        raise ConnectError(
            "permission_denied",
            f"user={user!r}: kernelgw's sandboxes run commands as their one unprivileged user, {USER!r}; "
            "leave the user out",
        )
    if not root_allowed:
        raise ConnectError(
            "permission_denied",
            "user='root': this gateway runs commands as the sandbox's one unprivileged user, 'user' (there is "
            "no sudo); leave the user out. An operator may allow root in gVisor sandboxes (e2b_root_commands).",
        )
    if runtime != "runsc":
        raise ConnectError(
            "permission_denied",
            f"user='root': root commands run only in gVisor (runsc) sandboxes; this one runs under {runtime}, "
            "where root would be the host's own uid 0. Leave the user out.",
        )
    return True


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


async def start(request: Request, sandbox: Sandbox, *, root: bool = False) -> Response:
    msg = await read_stream_message(request, StartRequest)
    tty = terminal_size(msg.pty) if msg.pty is not None else None
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
            # the sandbox's create-time envs too: a pooled kernel's container started without them
            env={"PWD": sandbox_path(rel), **sandbox.session.spec.env, **env},  # pwd names /home/user, as E2B's
            cwd=f"{WORKSPACE_DIR}/{rel}" if rel else WORKSPACE_DIR,
            stdin=msg.stdin is not False,  # envd: absent is open (a terminal's input always is)
            timeout_s=deadline,
            tty=tty,
            root=root,
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


async def stream_input(request: Request, sandbox: Sandbox) -> Response:
    """``StreamInput``: a start naming the process, then its input (stdin or
    pty bytes) written as each message arrives, and keepalives; one empty
    answer when the client ends its stream."""
    limit = timeout_s(request)
    command: RunningCommand | None = None
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            async for message in client_stream(request):
                msg = parse_message(message, StreamInputRequest)
                if msg.start is not None:
                    command = select(request, sandbox, msg.start.process)
                elif msg.data is not None:
                    if command is None:
                        raise ConnectError("invalid_argument", "StreamInput: the first message must be the start")
                    await write_input(command, msg.data.input)
                elif msg.keepalive is None:
                    raise ConnectError("invalid_argument", "StreamInput: a message is a start, data or a keepalive")
    except TimeoutError:
        if not deadline.expired():
            raise
        raise ConnectError("deadline_exceeded", f"The call did not end within its deadline ({limit:g} s)") from None
    if command is not None:
        sandbox.session.touch()
    return Response(envelope({}) + end_envelope(), media_type=STREAM_CONTENT_TYPE)


# ---------------------------------------------------------------- unary calls


async def list_call(request: Request, sandbox: Sandbox) -> dict[str, Any]:
    await read_message(request, Empty)
    running = [c for c in registry(request).commands(sandbox.id) if c.running]
    return {"processes": [process_info(c) for c in sorted(running, key=lambda c: c.pid)]}


async def send_input_call(request: Request, sandbox: Sandbox) -> dict[str, Any]:
    msg = await read_message(request, SendInputRequest)
    command = select(request, sandbox, msg.process)
    await write_input(command, msg.input)
    return {}


async def write_input(command: RunningCommand, given: ProcessInput) -> None:
    """``input.stdin`` to a command's stdin, ``input.pty`` to a terminal's (as envd: not crossed)."""
    if given.pty is not None:
        if not command.tty:
            raise ConnectError(
                "failed_precondition",
                f"process {command.pid} has no terminal (pty): send its input as stdin (sandbox.commands.send_stdin)",
            )
        field, text = "input.pty", given.pty
    elif given.stdin is not None:
        if command.tty:
            raise ConnectError(
                "failed_precondition",
                f"process {command.pid} runs in a terminal: send its input to the pty (sandbox.pty.send_stdin)",
            )
        field, text = "input.stdin", given.stdin
    else:
        raise ConnectError("invalid_argument", "input: give stdin or pty bytes")
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ConnectError("invalid_argument", f"{field} is not base64") from None
    await write_stdin(command, data)


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
    if command.tty:
        raise ConnectError(
            "failed_precondition",
            f"process {command.pid} runs in a terminal, whose input cannot be closed: send Ctrl-D (0x04) instead",
        )
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


async def update_call(request: Request, sandbox: Sandbox) -> dict[str, Any]:
    msg = await read_message(request, UpdateRequest)
    command = select(request, sandbox, msg.process)
    if msg.pty is None:
        return {}  # nothing to change, as envd
    size = terminal_size(msg.pty)
    if not command.tty:
        raise ConnectError(
            "failed_precondition",
            f"process {command.pid} was started without a terminal (pty): it has no size to set",
        )
    if not command.running:
        raise ConnectError("not_found", f"process with pid {command.pid} has ended")
    try:
        await command.resize(size)
    except KernelGWError as exc:
        raise ConnectError("failed_precondition", f"process {command.pid}: {exc.message}") from None
    return {}


class _Dict(BaseModel):
    """A unary answer already in proto3 JSON."""

    model_config = ConfigDict(extra="allow")


UNARY = {
    "List": list_call,
    "SendInput": send_input_call,
    "CloseStdin": close_stdin_call,
    "SendSignal": send_signal_call,
    "Update": update_call,
}

router = APIRouter(route_class=ConnectRoute, tags=["e2b"])


@router.post("/e2b/process.Process/{method}")
async def process(method: str, request: Request) -> Response:
    """One call of envd's process service (port 49983) on the sandbox's commands."""
    sandbox = await sandbox_for(request, ENVD_PORT)
    root = command_user_is_root(request, sandbox)
    try:
        if method == "Start":
            return await start(request, sandbox, root=root)
        if method == "Connect":
            return await connect(request, sandbox)
        if method == "StreamInput":
            return await stream_input(request, sandbox)
        call = UNARY.get(method)
        if call is None:
            raise ConnectError("unimplemented", f"process.Process has no method {method}")
        answer = await within_deadline(request, _as_model(call(request, sandbox)))
    except CommandNotFound as exc:
        raise ConnectError("not_found", exc.message) from None
    except KernelGWError as exc:
        raise connect_error(exc) from None
    return message_response(answer)


async def _as_model(work: Any) -> _Dict:
    return _Dict.model_validate(await work)
