"""Noticing a message ZMQ refused for its size, and reconnecting after it.

With ``MAXMSGSIZE`` set, a frame over the cap makes ZMQ drop the connection as a
protocol error instead of allocating it, and then it does not reconnect by
itself (after an ordinary disconnect, a kernel restarting or dying, it
schedules a retry at once). So a disconnect with no retry behind it within
`RETRY_GRACE_S` means a message was refused. Shared by the kernel link (/v1)
and the Jupyter channels, which each read their own sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

RETRY_GRACE_S = 0.5
"""After a disconnect, how long to wait for ZMQ's own reconnect attempt before
concluding it refused an oversized message (and will not retry)."""


async def watch_refused(
    sock: zmq.asyncio.Socket,
    on_refused: Callable[[], None],
    on_disconnect: Callable[[], None] = lambda: None,
    on_settled: Callable[[], None] = lambda: None,
) -> None:
    """Run until cancelled: after each refused message, reconnect ``sock`` and call
    ``on_refused``. ``on_disconnect`` is called at every disconnect and
    ``on_settled`` once it is known whether ZMQ retries (before ``on_refused``)."""
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
    try:
        while True:
            if parse_monitor_message(await monitor.recv_multipart())["event"] != zmq.EVENT_DISCONNECTED:
                continue
            on_disconnect()
            try:
                async with asyncio.timeout(RETRY_GRACE_S):
                    while parse_monitor_message(await monitor.recv_multipart())["event"] != zmq.EVENT_CONNECT_RETRIED:
                        pass
                continue  # ZMQ reconnects by itself: not a refused message
            except TimeoutError:
                pass
            finally:
                on_settled()
            with contextlib.suppress(zmq.ZMQError):
                sock.disconnect(endpoint)
            sock.connect(endpoint)
            on_refused()
    finally:
        monitor.close(linger=0)
