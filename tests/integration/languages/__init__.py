"""Kernels of other languages, each in a real container started by the gateway's
own backend (`DockerBackend`, a `KernelSpec` with the gateway's defaults) and
talked to with jupyter_client, the way the gateway talks to them.

`start_kernel` yields a `Kernel`; `Kernel.execute` sends what the gateway sends
(the ``artifacts`` and ``kernelgw_end`` user_expressions) and collects the
cell's output until its idle. Every container, volume and connection directory
of the test's backend is gone afterwards, or the test fails.

Image tags come from ``KERNELGW_IMAGE_<NAME>`` (default ``kernelgw/<name>:latest``);
a missing image fails the test with the command that builds it.
"""

from __future__ import annotations

import asyncio
import os
import queue
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from kernelgw.config import Settings, parse_uid_range
from kernelgw.runtime.backends.base import KernelHandle, KernelSpec
from kernelgw.runtime.backends.docker import DockerBackend
from kernelgw.runtime.execution import ARTIFACTS_EXPRESSION, ARTIFACTS_KEY, END_KEY

NOT_PASSED_ON = "SIGINT while no cell runs: not passed on"
"""What the shim (images/python/kernelgw_kernel/shim.py) says in the container's log
for a SIGINT that finds no cell running (tests/unit/test_shim.py holds them together)."""

RUNTIME_DIR = Path("/tmp/kgwt")


def image_for(name: str) -> str:
    """The image tag the tests of kernel ``name`` run (``KERNELGW_IMAGE_<NAME>``)."""
    return os.environ.get(f"KERNELGW_IMAGE_{name.upper()}", f"kernelgw/{name}:latest")


def require_image(tag: str, kernel: str) -> None:
    """Fail (never skip) when ``tag`` is missing, saying how to build it."""
    client = docker.from_env()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        how = (
            "kernelgw image build"
            if kernel == "python3"
            else f"kernelgw image build --kernel {kernel}" + ("" if tag.endswith(":latest") else f" --tag {tag}")
        )
        pytest.fail(f"Kernel image {tag} missing; build it with `{how}`", pytrace=False)
    finally:
        client.close()


@dataclass
class Result:
    """One cell: its execute_reply's content and every iopub message it caused."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    nonce: str = ""

    @property
    def status(self) -> str:
        return str(self.reply.get("status"))

    def stream(self, name: str) -> str:
        return "".join(
            m["content"]["text"] for m in self.messages if m["msg_type"] == "stream" and m["content"]["name"] == name
        )

    @property
    def stdout(self) -> str:
        return self.stream("stdout")

    @property
    def stderr(self) -> str:
        return self.stream("stderr")

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        return [m["content"] for m in self.messages if m["msg_type"] in types]

    @property
    def data(self) -> list[dict[str, Any]]:
        """The mime bundles of the cell's results and displays."""
        return [c["data"] for c in self.of_type("execute_result", "display_data")]

    @property
    def text(self) -> str:
        """Everything the cell said as text: streams and text/plain results."""
        return self.stdout + "".join(d.get("text/plain", "") for d in self.data)

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self.of_type("error")

    def expression(self, key: str) -> dict[str, Any]:
        return dict((self.reply.get("user_expressions") or {}).get(key) or {})

    @property
    def artifacts(self) -> list[dict[str, Any]]:
        import json

        value = self.expression(ARTIFACTS_KEY)
        assert value.get("status") == "ok", f"no artifacts in the reply: {self.reply}"
        items: list[dict[str, Any]] = json.loads(value["data"]["text/plain"])
        return items

    @property
    def proven(self) -> bool:
        """The reply carries the request's nonce (what the gateway checks)."""
        return (self.expression(END_KEY).get("data") or {}).get("text/plain") == repr(self.nonce)


class Kernel:
    def __init__(self, backend: DockerBackend, handle: KernelHandle, client: BlockingKernelClient) -> None:
        self.backend = backend
        self.handle = handle
        self.client = client

    def execute(self, code: str, timeout: float = 60.0, *, silent: bool = False) -> Result:
        """Run ``code`` as the gateway does and wait for its reply and idle."""
        nonce = secrets.token_hex(8)
        expressions = {ARTIFACTS_KEY: ARTIFACTS_EXPRESSION}
        if not silent:
            expressions[END_KEY] = repr(nonce)
        msg_id = self.client.execute(
            code,
            silent=silent,
            store_history=not silent,
            allow_stdin=False,
            stop_on_error=False,
            user_expressions=expressions,
        )
        return self.wait(msg_id, timeout, nonce)

    def wait(self, msg_id: str, timeout: float, nonce: str = "", before: list[dict[str, Any]] | None = None) -> Result:
        """The reply and iopub messages of ``msg_id`` (``before``: those already read)."""
        deadline = time.monotonic() + timeout
        reply: dict[str, Any] | None = None
        messages: list[dict[str, Any]] = list(before or [])
        idle = False
        while reply is None or not idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply and idle within {timeout} s; so far: {messages}")
            if reply is None and self.client.shell_channel.msg_ready():
                msg = self.client.get_shell_msg(timeout=left)
                if msg["parent_header"].get("msg_id") == msg_id:
                    reply = msg["content"]
                continue
            try:
                msg = self.client.get_iopub_msg(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                idle = idle or msg["content"]["execution_state"] == "idle"
            else:
                messages.append(msg)
        return Result(reply, messages, nonce)

    def signal(self, signum: int = signal.SIGINT) -> None:
        """A signal to the container, as the gateway interrupts a cell."""
        asyncio.run(self.backend.signal(self.handle, signum))

    def signal_between_cells(self, timeout: float = 30) -> None:
        """SIGINT the container while no cell runs, and wait until the shim has
        taken it (its log says it was not passed on): the signal reaches the shim
        through the container's init, later than the engine's answer, and one
        still on its way when the next cell is sent interrupts that cell."""
        container = docker.from_env().containers.get(self.handle.container_id)

        def said() -> int:
            return container.logs(stdout=False, stderr=True).decode(errors="replace").count(NOT_PASSED_ON)

        before = said()
        self.signal()
        deadline = time.monotonic() + timeout
        while said() == before:
            assert time.monotonic() < deadline, f"the shim never took the SIGINT within {timeout} s"
            time.sleep(0.05)

    def arrivals(self, code: str, timeout: float = 60) -> list[tuple[float, str, str]]:
        """Run ``code``; each stream message as (seconds after the request, name, text)."""
        msg_id = self.client.execute(code, stop_on_error=False, allow_stdin=False)
        sent = time.monotonic()
        came: list[tuple[float, str, str]] = []
        while True:
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                came.append((time.monotonic() - sent, msg["content"]["name"], msg["content"]["text"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return came

    def interrupt_when_started(self, code: str, marker: str, timeout: float = 30) -> tuple[Result, float]:
        """Run ``code``, SIGINT the container once ``marker`` is on its stdout (the
        cell is past its compilation, in its loop: a wait on that, not a sleep),
        and wait for the cell's end; the result (with the output read before the
        signal) and the seconds from the signal to the end."""
        msg_id = self.client.execute(code, stop_on_error=False, allow_stdin=False)
        deadline = time.monotonic() + timeout
        seen, early = "", []
        while marker not in seen:
            assert time.monotonic() < deadline, f"{marker!r} never came: {seen!r}"
            msg = self.client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id or msg["msg_type"] == "status":
                continue
            early.append(msg)
            if msg["msg_type"] == "stream":
                seen += msg["content"]["text"]
        signalled = time.monotonic()
        self.signal()
        result = self.wait(msg_id, timeout, before=early)
        return result, time.monotonic() - signalled

    def state(self) -> str:
        return asyncio.run(self.backend.state(self.handle)).status


def kernel_spec(image: str, **overrides: Any) -> KernelSpec:
    """The spec the gateway gives a session by default (as its tests run it:
    512 MB)."""
    s = Settings()
    base: dict[str, Any] = dict(
        session_id=f"lang-{secrets.token_hex(4)}",
        image=image,
        memory_mb=512,
        cpus=s.cpus,
        pids_limit=s.pids_limit,
        tmp_size_mb=s.tmp_size_mb,
        workspace_size_mb=s.workspace_size_mb,
        shm_size_mb=s.shm_size_mb,
        packages_size_mb=s.packages_size_mb,
        runtime=os.environ.get("KERNELGW_TEST_RUNTIME", "runc"),
    )
    base.update(overrides)
    return KernelSpec(**base)


@dataclass
class Started:
    kernel: Kernel
    ready_s: float
    """Seconds from the container's start to the kernel's kernel_info_reply."""


@contextmanager
def start_kernel(image: str, ready_timeout: float = 60.0, **spec: Any) -> Iterator[Started]:
    """A kernel container of ``image``, with the gateway's options; removed
    afterwards, and nothing of it may be left."""
    name = f"lg{os.getpid() % 100000}{secrets.token_hex(2)}"
    # each kernel as a uid of the gateway's range: the images must not assume theirs
    uids = Settings().kernel_uid_range
    backend = DockerBackend(
        gateway_name=name, runtime_dir=RUNTIME_DIR, kernel_uids=parse_uid_range(uids) if uids else None
    )
    kspec = kernel_spec(image, **spec)
    handle: KernelHandle | None = None
    client: BlockingKernelClient | None = None
    try:
        t0 = time.monotonic()
        handle = asyncio.run(backend.start(kspec))
        client = BlockingKernelClient()
        client.load_connection_info(handle.connection)
        client.start_channels(
            hb=False
        )  # a JVM or R under load misses the 1 s heartbeat: jupyter_client would call it dead
        if not _wait_ready(client, t0 + ready_timeout):
            logs = docker.from_env().containers.get(handle.container_id).logs().decode(errors="replace")
            raise AssertionError(f"kernel of {image} not ready in {ready_timeout} s\n{logs[-3000:]}")
        ready = time.monotonic() - t0
        yield Started(Kernel(backend, handle, client), ready)
    finally:
        if client is not None:
            client.stop_channels()
        if handle is not None:
            asyncio.run(backend.stop(handle))
        asyncio.run(backend.end_session(kspec.session_id))
        asyncio.run(backend.close())
        _assert_nothing_left(name)


def _wait_ready(client: BlockingKernelClient, deadline: float) -> bool:
    """As the gateway waits: kernel_info requests until one is answered on
    shell, then until one's status comes on iopub (its subscription is up).
    (jupyter_client's wait_for_ready calls a kernel dead whose heartbeat does
    not answer within a second, which a JVM does not.)"""
    answered = False
    while time.monotonic() < deadline:
        msg_id = client.kernel_info()
        try:
            while True:
                if not answered:
                    reply = client.get_shell_msg(timeout=0.25)
                    answered = reply["parent_header"].get("msg_id") == msg_id
                    if not answered:
                        continue
                msg = client.get_iopub_msg(timeout=0.25)
                if msg["parent_header"].get("msg_id") == msg_id:
                    _drain(client)
                    return True
        except queue.Empty:
            continue
    return False


def _drain(client: BlockingKernelClient) -> None:
    """Drop what the readiness requests left (their idles, late replies)."""
    time.sleep(0.05)
    for channel in (client.iopub_channel, client.shell_channel):
        while True:
            try:
                channel.get_msg(timeout=0.01)
            except queue.Empty:
                break


def _assert_nothing_left(name: str) -> None:
    client = docker.from_env()
    try:
        label = {"label": f"kernelgw.gateway={name}"}
        left = [c.name for c in client.containers.list(all=True, filters=label)]
        left += [f"volume {v.name}" for v in client.volumes.list(filters=label)]
        for c in client.containers.list(all=True, filters=label):
            c.remove(force=True)
        for v in client.volumes.list(filters=label):
            v.remove(force=True)
    finally:
        client.close()
    assert not left, f"left behind: {left}"
    assert not (RUNTIME_DIR / name).exists() or not any((RUNTIME_DIR / name).iterdir()), "connection directory left"


def p50(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2]


def ok(result: Result) -> Result:
    assert result.status == "ok", (result.reply, result.messages)
    assert result.proven, result.reply  # the shim answered the gateway's nonce
    return result
