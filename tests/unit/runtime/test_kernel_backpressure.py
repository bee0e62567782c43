"""A flooding cell waits for its reader (kernelgw_kernel.backpressure).

A real ipykernel with the image's launcher (tests/support/local_backend.py) and
a real ZMQ subscriber that stops reading: the cell's loop must stop making
progress (it blocks in ``print`` or ``display``), go on once the subscriber
reads again, and end on an interrupt while it waits. With no subscriber at all
the cell must not wait (XPUB drops for peers that are not there).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient

from kernelgw.runtime.kernel_link import IOPUB_WAITS_FEATURE
from tests.support.local_backend import LocalBackend, image_helper
from tests.unit.runtime.conftest import spec

PROGRESS_EVERY = 20
"""Small beside what may be queued before a send blocks (the kernel's 32, the
subscriber's 16, the socket buffers): at 200, a display flood could block before
its first progress was written, and the test saw "never waited" (CI#22, once)."""
FLOODS = {
    "print": "print('x' * 99)",
    "display": "display(n)",
}


def flood_cell(kind: str) -> str:
    """An endless flood that writes how far it got to ``progress`` every `PROGRESS_EVERY` outputs."""
    return (
        "n = 0\n"
        "while True:\n"
        f"    {FLOODS[kind]}\n"
        "    n += 1\n"
        f"    if n % {PROGRESS_EVERY} == 0:\n"
        "        with open('progress.tmp', 'w') as f:\n"
        "            f.write(str(n))\n"
        "        __import__('os').replace('progress.tmp', 'progress')\n"
    )


@dataclass
class Kernel:
    backend: LocalBackend
    handle: Any
    client: AsyncKernelClient

    @property
    def progress_file(self) -> Path:
        return Path(self.handle.conn_dir) / "workspace" / "progress"

    def progress(self) -> int:
        try:
            return int(self.progress_file.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0


@pytest.fixture
def backpressure() -> Any:
    with image_helper("backpressure") as module:
        yield module


@pytest.fixture
async def kernel(tmp_path: Path) -> AsyncIterator[Kernel]:
    backend = LocalBackend(base_dir=tmp_path)
    handle = await backend.start(spec())
    # its own context: what the subscriber leaves unread stays in the kernel
    # (a small receive queue), and no other test's sockets get that queue
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.RCVHWM, 16)
    client = AsyncKernelClient(context=context)
    client.load_connection_info(handle.connection)
    try:
        yield Kernel(backend, handle, client)
    finally:
        client.stop_channels()
        await backend.stop(handle)
        context.destroy(linger=0)


async def wait_ready(kernel: Kernel) -> None:
    client = kernel.client
    client.start_channels(hb=False)  # the process is watched by the backend
    await client.wait_for_ready(timeout=60)


async def stalled(kernel: Kernel, quiet_s: float = 2.0, limit_s: float = 90.0) -> int:
    """The progress once it has not moved for ``quiet_s`` (fails after ``limit_s``)."""
    last, since = kernel.progress(), time.monotonic()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        now = kernel.progress()
        if now != last:
            last, since = now, time.monotonic()
        elif now > 0 and time.monotonic() - since >= quiet_s:
            return now
    raise AssertionError(f"the flood never waited for its reader: progress {last} after {limit_s:g}s")


async def drain(client: AsyncKernelClient, seconds: float) -> int:
    """Read iopub for ``seconds``; how many messages came."""
    got = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            await client.get_iopub_msg(timeout=min(left, 0.2))
            got += 1
        except Exception:  # queue.Empty: nothing this instant
            continue
    return got


async def reply_to(client: AsyncKernelClient, msg_id: str, reading: bool, limit_s: float = 60) -> Any:
    """The execute_reply to ``msg_id`` (None after ``limit_s``), reading iopub meanwhile if ``reading``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if reading:
            await drain(client, 0.2)
        try:
            msg = await client.get_shell_msg(timeout=0.1 if reading else 0.5)
        except Exception:  # queue.Empty
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    return None


@pytest.mark.parametrize("kind", sorted(FLOODS))
async def test_a_flood_waits_while_its_reader_does_not_read(kernel: Kernel, kind: str) -> None:
    await wait_ready(kernel)
    await drain(kernel.client, 0.5)  # what the start sent
    info = await kernel.client.kernel_info(reply=True, timeout=30)
    assert "kernelgw: iopub waits for its reader" in info["content"]["supported_features"]
    msg_id = kernel.client.execute(flood_cell(kind))

    held = await stalled(kernel)
    print(f"{kind}: the flood waited after {held} outputs")

    # it was waiting for us, not dead: reading lets it go on
    deadline = time.monotonic() + 60
    while kernel.progress() <= held and time.monotonic() < deadline:
        assert await drain(kernel.client, 0.5) > 0
    assert kernel.progress() > held

    # an interrupt ends it while it waits (we read on, as the gateway does)
    held = await stalled(kernel)
    await kernel.backend.signal(kernel.handle, signal.SIGINT)
    reply = await reply_to(kernel.client, msg_id, reading=True)
    assert reply is not None, "no execute_reply after the interrupt"
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"


async def test_with_nobody_subscribed_nothing_waits(kernel: Kernel) -> None:
    client = kernel.client
    client.shell_channel.start()  # no iopub subscriber at all
    msg_id = client.execute("for i in range(30_000):\n    print('x' * 99)\n    display(i) if i % 10 == 0 else None")
    reply = await reply_to(client, msg_id, reading=False)
    assert reply is not None, "the cell waited for a reader that does not exist"
    assert reply["content"]["status"] == "ok"


def test_only_an_xpub_socket_is_bounded(backpressure: ModuleType) -> None:
    context = zmq.Context()
    try:
        xpub, router = context.socket(zmq.XPUB), context.socket(zmq.ROUTER)
        for s in (xpub, router):
            s.setsockopt(zmq.SNDHWM, 100_000)
            backpressure.bound_iopub_socket(s)
        assert xpub.getsockopt(zmq.SNDHWM) == backpressure.IOPUB_SEND_HWM
        assert router.getsockopt(zmq.SNDHWM) == 100_000
        xpub.close()
        router.close()
    finally:
        context.term()


def test_the_gateway_looks_for_the_feature_the_kernel_advertises(backpressure: ModuleType) -> None:
    """The gateway paces a kernel's output only when its kernel_info lists this
    feature (`KernelLink._paced`): spelt two ways, no flood would ever be paced."""
    assert IOPUB_WAITS_FEATURE == backpressure.FEATURE
