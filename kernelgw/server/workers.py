"""``kernelgw serve --workers N``: N gateway processes behind one port, as one gateway.

One gateway is one asyncio process: it decodes every kernel's messages on one
core. Here a supervisor (no event loop, no kernels) holds the public port and
starts N worker processes (multiprocessing, spawn), each listening on the port
with a socket of its own (SO_REUSEPORT), so the kernel spreads new connections
evenly over the workers. Each worker
is a whole gateway and a node of a cluster (`kernelgw.cluster`), exactly as
gateways on several hosts are: it owns the sessions it creates, and a request
that lands on a worker which does not run its session is forwarded to the
owner by `kernelgw.server.forward` over the owner's private listener
(``127.0.0.1:<port>``, its ``advertise_url``). There is no second routing
mechanism.

What each worker gets (`worker_settings`): the name ``<name>`` for the first
and ``<name>-w<i>`` for the others (stable: a restarted worker reattaches its
own kernels, and a gateway that goes from one process to several keeps its
sessions on the first), the same store, one ``cluster_secret`` and one
``token_secret`` (generated here when unset, never logged: browser tokens
minted by one worker verify on all), and, past the first, its own
``data_dir`` for paused sessions' snapshots (a worker removes snapshots that
are not its own at start) with the database pinned to the shared one.

The supervisor restarts a worker that dies (its sessions come back through
reattachment, as after a gateway restart), passes SIGTERM and SIGINT on to the
workers (each drains; a second signal makes them exit at once) and ends when
they have all ended. Workers run in their own process group, so a terminal's
Ctrl-C reaches them once, through the supervisor; a worker whose supervisor is
gone drains and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import secrets
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from kernelgw.config import Settings
from kernelgw.errors import KernelGWError
from kernelgw.storage.engine import database_url_for

if TYPE_CHECKING:
    from kernelgw.server.serving import DrainingServer

log = logging.getLogger(__name__)

_spawn = multiprocessing.get_context("spawn")

BACKLOG = 2048
"""Each listening socket's accept queue (uvicorn's default)."""
RESTART_DELAY_S = (0.5, 30.0)
"""A worker that dies is restarted after the first delay, doubled for each death
in a row within `STABLE_AFTER_S` of its start, up to the second."""
STABLE_AFTER_S = 30.0
_POLL_S = 0.5


class WorkerNameTooLong(KernelGWError):
    """``<gateway_name>-w<i>`` would pass the 63 characters a gateway name may have."""

    status_code = 400
    code = "worker_name_too_long"


class WorkerFailedToStart(KernelGWError):
    """A worker ended before it served: the whole gateway does not start."""

    status_code = 503
    code = "worker_failed_to_start"


# ---------------------------------------------------------------- settings of each worker
def worker_name(name: str, index: int) -> str:
    """The first worker keeps the gateway's name; the others are ``<name>-w<i>``."""
    return name if index == 0 else f"{name}-w{index}"


@dataclass(frozen=True)
class SharedSecrets:
    """What every worker must hold alike, from the settings or made up once here."""

    cluster_secret: SecretStr
    token_secret: SecretStr
    cluster_from_user: bool
    """The user set ``cluster_secret``: the workers also join gateways on other hosts."""

    @classmethod
    def of(cls, settings: Settings) -> SharedSecrets:
        return cls(
            cluster_secret=settings.cluster_secret or SecretStr(secrets.token_urlsafe(32)),
            token_secret=settings.token_secret or SecretStr(secrets.token_urlsafe(32)),
            cluster_from_user=settings.cluster_secret is not None,
        )


def private_host(settings: Settings, shared: SharedSecrets) -> str:
    """Where a worker's private listener binds: loopback, unless the user's own
    cluster spans hosts, whose gateways must reach each worker."""
    return settings.host if shared.cluster_from_user else "127.0.0.1"


def private_url(settings: Settings, shared: SharedSecrets, port: int) -> str:
    """A worker's ``advertise_url``: its private listener, as its peers reach it."""
    if not shared.cluster_from_user:
        return f"http://127.0.0.1:{port}"
    parts = urlsplit(settings.own_url())
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme, f"{host}:{port}", "", "", ""))


def worker_settings(settings: Settings, index: int, advertise_url: str, shared: SharedSecrets) -> Settings:
    """Worker ``index``'s settings: the gateway's, as one node of a cluster."""
    name = worker_name(settings.gateway_name, index)
    if len(name) > 63:
        raise WorkerNameTooLong(
            f"With {settings.workers} workers the gateway's name {settings.gateway_name!r} becomes {name!r}, "
            "longer than the 63 characters a gateway name may have: choose a shorter --gateway-name."
        )
    update: dict[str, object] = {
        "workers": 1,
        "gateway_name": name,
        "advertise_url": advertise_url,
        "cluster_secret": shared.cluster_secret,
        "token_secret": shared.token_secret,
    }
    if not shared.cluster_from_user:  # a cluster of these workers only, whoever else shares the database
        update["cluster_peers"] = [worker_name(settings.gateway_name, i) for i in range(settings.workers)]
    if index > 0:
        # the same database, but a directory of its own for paused sessions' snapshots
        update["database_url"] = settings.database_url or database_url_for(settings)
        update["data_dir"] = Path(settings.data_dir) / "workers" / name
    return settings.model_copy(update=update)


def restart_delay(deaths_in_a_row: int) -> float:
    """How long a worker that died waits to start again: short after a single
    death, doubling while it keeps dying soon after its start (a crash loop
    must not spin), at most `RESTART_DELAY_S`'s second value."""
    first, most = RESTART_DELAY_S
    return float(min(first * 2 ** max(deaths_in_a_row - 1, 0), most))


# ---------------------------------------------------------------- sockets
def bind_socket(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` (listening unless told otherwise)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def previous_ports(settings: Settings, names: list[str]) -> dict[str, int]:
    """The private ports the workers of these names advertised last time (from the
    registry): reused when free, so a gateway restarted after a crash is not
    refused as "another gateway of this name at another address" while the old
    rows are still fresh."""
    from sqlalchemy.exc import SQLAlchemyError

    from kernelgw.cluster.registry import GatewayRegistry
    from kernelgw.storage.engine import create_store_engine

    async def read() -> dict[str, int]:
        engine = create_store_engine(database_url_for(settings), settings.durability)
        try:
            registry = GatewayRegistry(engine, "", "", heartbeat_s=1.0, gone_after_s=1.0, running_sessions=lambda: 0)
            await registry.refresh()
            ports = {}
            for name in names:
                gateway = registry.gateway(name)
                if gateway is not None and (port := urlsplit(gateway.url).port):
                    ports[name] = port
            return ports
        finally:
            await engine.dispose()

    try:
        return asyncio.run(read())
    except (SQLAlchemyError, OSError) as exc:
        log.info("workers: the registry could not be read (%s); private ports are new", exc)
        return {}


def bind_private(host: str, port: int | None) -> socket.socket:
    """A worker's private listener: on its previous port when that is free."""
    if port:
        with contextlib.suppress(OSError):
            return bind_socket(host, port)
    return bind_socket(host, 0)


# ---------------------------------------------------------------- the worker process
def _label_logs(name: str) -> None:
    """Every log line of a worker names it (a ``gateway`` field in JSON, ``[name]`` in text)."""

    def label(record: logging.LogRecord) -> bool:
        record.gateway = name
        return True

    for handler in logging.getLogger().handlers:
        handler.addFilter(label)
        if type(handler.formatter) is logging.Formatter:
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(gateway)s]: %(message)s"))


def _report_ready(server: DrainingServer, ready: Connection) -> None:
    """Tell the supervisor once uvicorn serves (a thread of the worker)."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        ready.send(os.getpid())


def _watch_supervisor(server: DrainingServer) -> None:
    """Drain and exit when the supervisor is gone (a thread of the worker)."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    select.select([parent.sentinel], [], [])
    log.warning("the supervisor (pid %s) is gone: draining and exiting", parent.pid)
    server.handle_exit(signal.SIGTERM, None)


def run_worker(settings: Settings, sockets: list[socket.socket], ready: Connection) -> None:
    """A worker: one whole gateway serving on the public and its private socket."""
    os.setpgrp()  # a terminal's Ctrl-C reaches the supervisor only, which passes it on once
    from kernelgw import logs
    from kernelgw.server.app import create_app
    from kernelgw.server.serving import DrainingServer, uvicorn_config

    logs.configure(settings.log_format)
    _label_logs(settings.gateway_name)
    app = create_app(settings)
    server = DrainingServer(uvicorn_config(app, settings), app, settings.shutdown_grace_s)
    threading.Thread(target=_report_ready, args=(server, ready), daemon=True, name="ready").start()
    threading.Thread(target=_watch_supervisor, args=(server,), daemon=True, name="supervisor-watch").start()
    server.run(sockets=sockets)


# ---------------------------------------------------------------- the supervisor
@dataclass
class Worker:
    index: int
    settings: Settings
    private: socket.socket
    process: SpawnProcess | None = None
    ready: Connection | None = None
    pid: int | None = None
    up: bool = False
    ever_up: bool = False
    started_at: float = 0.0
    deaths_in_a_row: int = 0
    restart_at: float | None = None

    @property
    def name(self) -> str:
        return self.settings.gateway_name

    @property
    def address(self) -> str:
        host, port = self.private.getsockname()[:2]
        return f"{host}:{port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.exitcode is None


@dataclass
class Supervisor:
    """Starts the workers, restarts those that die, passes signals on (see the module docstring)."""

    settings: Settings
    workers: list[Worker] = field(default_factory=list)
    signals: int = 0

    def prepare(self) -> None:
        """Bind the sockets and derive every worker's settings (before any process starts)."""
        s = self.settings
        shared = SharedSecrets.of(s)
        names = [worker_name(s.gateway_name, i) for i in range(s.workers)]
        ports = previous_ports(s, names)
        host = private_host(s, shared)
        # nobody listens on the public port yet (another gateway, another supervisor):
        # a plain listener is refused where any socket listens, SO_REUSEPORT or not
        bind_socket(s.host, s.port).close()
        for i, name in enumerate(names):
            private = bind_private(host, ports.get(name))
            port = private.getsockname()[1]
            self.workers.append(Worker(i, worker_settings(s, i, private_url(s, shared, port), shared), private))

    def run(self) -> int:
        """Serve until the workers have ended after a signal; the exit status."""
        if not self.workers:
            self.prepare()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for w in self.workers:
                self._start(w)
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for w in self.workers:
                w.private.close()

    # ------------------------------------------------------------ signals
    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        name = signal.Signals(sig).name
        if self.signals == 1:
            log.warning("%s: the %d workers drain (a second signal makes them exit at once)", name, len(self.workers))
        else:
            log.warning("%s again: the workers exit now", name)
        for w in self.workers:
            if w.alive() and w.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, sig)

    @property
    def stopping(self) -> bool:
        return self.signals > 0

    # ------------------------------------------------------------ processes
    def _start(self, w: Worker) -> None:
        # each worker listens on a socket of its own on the public port (SO_REUSEPORT):
        # the kernel spreads new connections evenly over the workers' sockets (a
        # shared socket gave every connection to the same worker at low load). The
        # worker holds the only reference: a dead worker's socket leaves the group,
        # and new connections go to the live ones until it is back (those already
        # queued on the dead one's socket are reset).
        public = bind_socket(self.settings.host, self.settings.port, reuse_port=True)
        ours, theirs = _spawn.Pipe(duplex=False)
        process = _spawn.Process(
            target=run_worker,
            args=(w.settings, [public, w.private], theirs),
            name=f"kernelgw-{w.name}",
            daemon=False,
        )
        try:
            process.start()
        finally:
            public.close()
            theirs.close()
        w.process, w.ready, w.pid, w.up = process, ours, process.pid, False
        w.started_at, w.restart_at = time.monotonic(), None
        log.info("worker %s started (pid %d, private listener %s)", w.name, process.pid, w.address)

    def _loop(self) -> int:
        announced = False
        while True:
            waitables: list[object] = []
            for w in self.workers:
                if w.alive():
                    assert w.process is not None
                    waitables.append(w.process.sentinel)
                    if w.ready is not None:
                        waitables.append(w.ready)
            for ready in wait(waitables, timeout=_POLL_S):  # type: ignore[arg-type]
                self._handle(ready)
            if self.stopping:
                if not any(w.alive() for w in self.workers):
                    log.warning("all %d workers have ended", len(self.workers))
                    return 0
                continue
            failed = next((w for w in self.workers if not w.ever_up and not w.alive()), None)
            if failed is not None:
                self._stop_all()
                raise WorkerFailedToStart(
                    f"Worker {failed.name} ended before it served (exit code {failed.process.exitcode if failed.process else None}); "
                    "its log lines above say why. The other workers were stopped."
                )
            if not announced and all(w.up for w in self.workers):
                announced = True
                self._announce()
            now = time.monotonic()
            for w in self.workers:
                if w.restart_at is not None and now >= w.restart_at:
                    self._start(w)

    def _handle(self, ready: object) -> None:
        for w in self.workers:
            if w.ready is not None and ready is w.ready:
                conn, w.ready = w.ready, None
                try:
                    w.pid = conn.recv()
                except (EOFError, OSError):
                    return
                finally:
                    conn.close()
                w.up = w.ever_up = True
                if w.deaths_in_a_row:
                    log.warning("worker %s serves again (pid %s)", w.name, w.pid)
                return
            if w.process is not None and ready == w.process.sentinel:
                w.process.join()
                self._ended(w)
                return

    def _ended(self, w: Worker) -> None:
        assert w.process is not None
        code, w.up = w.process.exitcode, False
        if w.ready is not None:
            w.ready.close()
            w.ready = None
        if self.stopping or not w.ever_up:
            log.info("worker %s (pid %s) ended (exit code %s)", w.name, w.pid, code)
            return
        stable = time.monotonic() - w.started_at >= STABLE_AFTER_S
        w.deaths_in_a_row = 1 if stable else w.deaths_in_a_row + 1
        delay = restart_delay(w.deaths_in_a_row)
        w.restart_at = time.monotonic() + delay
        log.error(
            "worker %s (pid %s) died (exit code %s); restarting it in %.1f s: its sessions come back by reattachment",
            w.name,
            w.pid,
            code,
            delay,
        )

    def _stop_all(self) -> None:
        self.signals += 1
        for w in self.workers:
            if w.alive() and w.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGTERM)
        for w in self.workers:
            if w.process is not None:
                w.process.join()

    def _announce(self) -> None:
        s = self.settings
        names = ", ".join(f"{w.name} (pid {w.pid}, {w.address})" for w in self.workers)
        log.info(
            "kernelgw serves http://%s:%d with %d worker processes, one gateway to the outside: %s. "
            "Per worker: pool_size=%d, max_sessions=%d, rate limits and /metrics.",
            f"[{s.host}]" if ":" in s.host else s.host,
            s.port,
            len(self.workers),
            names,
            s.pool_size,
            s.max_sessions,
        )
