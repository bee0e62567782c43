"""A relay in front of a kernel that cannot serve kernelgw's sockets itself.

``python -m kernelgw_kernel.shim [--transport tcp|ipc] [--interrupt signal|message]
[--connection-file /conn/kernel.json] -- ARGV...``

The gateway connects to five ipc sockets named in ``/conn/kernel.json``. Some
kernels cannot bind them: Deno rejects an ipc address, JJava's JeroMQ only
emulates ipc over TCP. Some cannot be interrupted by SIGINT (the gateway's
interrupt), and none but IPython can evaluate the Python expression with which
the gateway asks which workspace files a cell wrote. The shim:

- binds the five ipc sockets of the connection file (the front);
- writes a private connection file for the real kernel (same key; 127.0.0.1 on
  free TCP ports, or ipc sockets in a private directory under /tmp) and starts
  ARGV with every ``{connection_file}`` replaced by its path;
- relays every channel both ways, frames unchanged (shell, control, stdin:
  ROUTER front, DEALER back, the gateway's routing identities kept as frames;
  iopub: XPUB front, XSUB back; heartbeat: ROUTER front, DEALER back, so the
  kernel itself answers the pings) in one thread with one poller;
- answers two of the gateway's ``user_expressions`` itself and strips them
  from the execute_request (re-signed): ``artifacts`` (the files in /workspace
  that changed since the last non-silent execute_request passed; on every
  reply, whatever its status) and ``kernelgw_end`` (a quoted nonce, the proof
  that a reply answered its request; its own text, on replies with status
  ``ok``, as IPython evaluates user_expressions only then);
- on SIGINT forwards SIGINT to the kernel (``--interrupt signal``) or sends a
  signed ``interrupt_request`` on the control channel from its own socket
  (``--interrupt message``; the reply is dropped);
- on SIGTERM ends the kernel (SIGTERM, then SIGKILL after a grace); exits with
  the kernel's status once the kernel has exited.

The kernel is untrusted code's host (it holds the key anyway): the shim never
fails on what it relays. A message it cannot parse, or whose signature does
not check, is forwarded as it came. Standard library and pyzmq only; it starts
in well under 100 ms.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import socket
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import zmq

DELIM = b"<IDS|MSG>"
CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
HWM = 100_000
"""Messages queued per peer and direction, as the gateway and ipykernel use
(zmq's default of 1000 drops iopub output in a flood)."""
RECONNECT_IVL_MS = 10
"""The kernel binds its ports some time after it starts: try again soon (zmq's
default of 100 ms would add up to 100 ms to every cold start)."""
TERM_GRACE_S = 5.0
"""After SIGTERM, how long the kernel may take before it is killed."""
DRAIN_S = 0.2
"""After the kernel exited, how long what it sent last is still relayed."""
LINGER_MS = 1000
PENDING_MAX = 1024
"""Requests whose expressions are remembered until their reply (a kernel that
never replies cannot make the table grow)."""
ARTIFACTS_KEY = "artifacts"
ARTIFACTS_EXPRESSION = "__import__('kernelgw_kernel').artifacts()"
END_KEY = "kernelgw_end"
_NONCE = re.compile(r"'[0-9A-Za-z_.:-]{1,128}'")


# ------------------------------------------------------------------ pure logic


def substitute(argv: list[str], connection_file: str) -> list[str]:
    """``argv`` with every ``{connection_file}`` replaced by the path."""
    return [arg.replace("{connection_file}", connection_file) for arg in argv]


def parse_args(args: list[str]) -> tuple[str, str, str, list[str]]:
    """(transport, interrupt mode, connection file, kernel argv); raises
    ValueError with a usage message."""
    transport, interrupt, conn = "tcp", "signal", "/conn/kernel.json"
    i = 0
    while i < len(args) and args[i] != "--":
        opt, _, value = args[i].partition("=")
        if opt not in ("--transport", "--interrupt", "--connection-file"):
            raise ValueError(f"unknown option {args[i]!r}")
        if not value:
            i += 1
            if i >= len(args):
                raise ValueError(f"{opt} needs a value")
            value = args[i]
        if opt == "--transport":
            if value not in ("tcp", "ipc"):
                raise ValueError("--transport is tcp or ipc")
            transport = value
        elif opt == "--interrupt":
            if value not in ("signal", "message"):
                raise ValueError("--interrupt is signal or message")
            interrupt = value
        else:
            conn = value
        i += 1
    argv = args[i + 1 :]
    if not argv:
        raise ValueError("no kernel command after --")
    return transport, interrupt, conn, argv


def addresses(info: dict[str, Any]) -> dict[str, str]:
    """ZMQ address of each channel of a connection file's dict."""
    transport, ip = info.get("transport", "tcp"), info["ip"]
    sep = "-" if transport == "ipc" else ":"
    return {ch: f"{transport}://{ip}{sep}{info[ch + '_port']}" for ch in CHANNELS}


class Signer:
    """HMAC of a message's four parts, as jupyter_client signs them."""

    def __init__(self, key: bytes, scheme: str = "hmac-sha256") -> None:
        self.key = key
        algo = scheme.partition("-")[2] or "sha256"
        self.digest = getattr(hashlib, algo.replace("-", "_"), hashlib.sha256)

    def sign(self, parts: list[bytes]) -> bytes:
        if not self.key:
            return b""
        mac = hmac.new(self.key, digestmod=self.digest)
        for part in parts:
            mac.update(part)
        return mac.hexdigest().encode()

    def verify(self, signature: bytes, parts: list[bytes]) -> bool:
        return hmac.compare_digest(signature, self.sign(parts))


def split(frames: list[bytes]) -> int | None:
    """Index of the delimiter in a multipart message that has the four parts
    after its signature; None when it is not one."""
    try:
        i = frames.index(DELIM)
    except ValueError:
        return None
    return i if len(frames) >= i + 6 else None


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


class Expressions:
    """The gateway's user_expressions the shim answers for a kernel that
    cannot evaluate Python: stripped from execute_requests, answered in the
    execute_replies (messages re-signed). ``snapshot`` and ``changes`` are
    kernelgw_kernel's (injected so tests need no workspace)."""

    def __init__(
        self,
        signer: Signer,
        snapshot: Callable[[], Any],
        changes: Callable[[Any, Any], list[dict[str, Any]]],
    ) -> None:
        self.signer = signer
        self.snapshot = snapshot
        self.changes = changes
        self.before: Any = None
        self.pending: OrderedDict[str, dict[str, str]] = OrderedDict()
        """msg_id of a request -> the expressions taken out of it."""

    def request(self, frames: list[bytes]) -> list[bytes]:
        """An execute_request from the gateway, with our expressions taken out
        (the same frames when there is nothing to do)."""
        i = split(frames)
        if i is None:
            return frames
        header = json.loads(frames[i + 2])
        if not isinstance(header, dict) or header.get("msg_type") != "execute_request":
            return frames
        parts = frames[i + 2 : i + 6]
        if not self.signer.verify(frames[i + 1], parts):
            return frames
        content = json.loads(frames[i + 5])
        if not isinstance(content, dict):
            return frames
        if not content.get("silent"):
            self.before = self.snapshot()
        expressions = content.get("user_expressions")
        if not isinstance(expressions, dict):
            return frames
        ours = {}
        if expressions.get(ARTIFACTS_KEY) == ARTIFACTS_EXPRESSION:
            ours[ARTIFACTS_KEY] = ARTIFACTS_EXPRESSION
        end = expressions.get(END_KEY)
        if isinstance(end, str) and _NONCE.fullmatch(end):
            ours[END_KEY] = end
        if not ours:
            return frames
        msg_id = header.get("msg_id")
        if not isinstance(msg_id, str):
            return frames
        content["user_expressions"] = {k: v for k, v in expressions.items() if k not in ours}
        self.pending[msg_id] = ours
        while len(self.pending) > PENDING_MAX:
            self.pending.popitem(last=False)
        new_content = _dumps(content)
        signature = self.signer.sign([frames[i + 2], frames[i + 3], frames[i + 4], new_content])
        return [*frames[: i + 1], signature, frames[i + 2], frames[i + 3], frames[i + 4], new_content, *frames[i + 6 :]]

    def reply(self, frames: list[bytes]) -> list[bytes]:
        """An execute_reply from the kernel, with the answers to what its
        request asked of us added (the same frames otherwise)."""
        if not self.pending:
            return frames
        i = split(frames)
        if i is None:
            return frames
        header = json.loads(frames[i + 2])
        if not isinstance(header, dict) or header.get("msg_type") != "execute_reply":
            return frames
        parent = json.loads(frames[i + 3])
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        if not isinstance(msg_id, str) or msg_id not in self.pending:
            return frames
        content = json.loads(frames[i + 5])
        if not isinstance(content, dict):
            return frames
        ours = self.pending.pop(msg_id)
        answers = content.get("user_expressions")
        answers = dict(answers) if isinstance(answers, dict) else {}
        if ARTIFACTS_KEY in ours:
            items = [] if self.before is None else self.changes(self.before, self.snapshot())
            answers[ARTIFACTS_KEY] = _value(json.dumps(items, separators=(",", ":")))
        if END_KEY in ours and content.get("status") == "ok":
            answers[END_KEY] = _value(ours[END_KEY])
        content["user_expressions"] = answers
        new_content = _dumps(content)
        signature = self.signer.sign([frames[i + 2], frames[i + 3], frames[i + 4], new_content])
        return [*frames[: i + 1], signature, frames[i + 2], frames[i + 3], frames[i + 4], new_content, *frames[i + 6 :]]


def _value(text: str) -> dict[str, Any]:
    """A user_expression's result as IPython gives it."""
    return {"status": "ok", "data": {"text/plain": text}, "metadata": {}}


def interrupt_message(signer: Signer, session: str, n: int) -> list[bytes]:
    """A signed interrupt_request (no routing identity: sent from a DEALER)."""
    header = {
        "msg_id": f"{session}_{os.getpid()}_{n}",
        "msg_type": "interrupt_request",
        "username": "kernelgw",
        "session": session,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        "version": "5.3",
    }
    parts = [_dumps(header), b"{}", b"{}", b"{}"]
    return [DELIM, signer.sign(parts), *parts]


def exit_status(wait_status: int) -> int:
    """A shell's exit code for a waitpid status."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else 1


# ------------------------------------------------------------------ the relay


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (the container's own loopback:
    nobody else races for them)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def private_connection(front: dict[str, Any], transport: str) -> tuple[str, dict[str, Any]]:
    """A private directory under /tmp and the kernel's connection dict (same key)."""
    tmp = os.environ.get("TMPDIR") or "/tmp"
    directory = os.path.join(tmp, f"kernelgw-shim-{os.getpid()}-{os.urandom(4).hex()}")
    os.mkdir(directory, 0o700)
    info: dict[str, Any] = {
        "transport": transport,
        "key": front.get("key", ""),
        "signature_scheme": front.get("signature_scheme", "hmac-sha256"),
        "kernel_name": front.get("kernel_name", ""),
    }
    if transport == "tcp":
        info["ip"] = "127.0.0.1"
        ports = free_ports(len(CHANNELS))
    else:
        info["ip"] = os.path.join(directory, "k")
        ports = list(range(1, len(CHANNELS) + 1))
    for ch, port in zip(CHANNELS, ports, strict=True):
        info[f"{ch}_port"] = port
    return directory, info


class Shim:
    def __init__(self, front: dict[str, Any], back: dict[str, Any], interrupt: str) -> None:
        self.interrupt_mode = interrupt
        self.signer = Signer(str(front.get("key", "")).encode(), str(front.get("signature_scheme", "hmac-sha256")))
        self.session = os.urandom(8).hex()
        self.interrupts = 0
        self.ctx = zmq.Context()
        f, b = addresses(front), addresses(back)
        identity = b"kernelgw-shim-" + self.session.encode()
        # the kernel routes stdin messages to the identity a shell request came
        # from: the shell and stdin sockets toward it share one identity
        self.front = {
            "shell": self._socket(zmq.ROUTER, bind=f["shell"]),
            "control": self._socket(zmq.ROUTER, bind=f["control"]),
            "stdin": self._socket(zmq.ROUTER, bind=f["stdin"]),
            "hb": self._socket(zmq.ROUTER, bind=f["hb"]),
            "iopub": self._socket(zmq.XPUB, bind=f["iopub"]),
        }
        self.back = {
            "shell": self._socket(zmq.DEALER, connect=b["shell"], identity=identity),
            "control": self._socket(zmq.DEALER, connect=b["control"], identity=identity),
            "stdin": self._socket(zmq.DEALER, connect=b["stdin"], identity=identity),
            "hb": self._socket(zmq.DEALER, connect=b["hb"]),
            "iopub": self._socket(zmq.XSUB, connect=b["iopub"]),
        }
        self.interrupter: zmq.Socket[bytes] | None = None
        if interrupt == "message":
            self.interrupter = self._socket(zmq.DEALER, connect=b["control"])
        import kernelgw_kernel

        self.expressions = Expressions(self.signer, kernelgw_kernel.snapshot, kernelgw_kernel.changes)
        self.peer: dict[zmq.Socket[bytes], zmq.Socket[bytes]] = {}
        self.channel: dict[zmq.Socket[bytes], str] = {}
        for ch in CHANNELS:
            self.peer[self.front[ch]] = self.back[ch]
            self.peer[self.back[ch]] = self.front[ch]
            self.channel[self.front[ch]] = ch
            self.channel[self.back[ch]] = ch

    def _socket(self, kind: int, *, bind: str = "", connect: str = "", identity: bytes = b"") -> zmq.Socket[bytes]:
        s: zmq.Socket[bytes] = self.ctx.socket(kind)
        # what is still queued for the gateway goes out at the end; nothing
        # waits for a kernel that is gone
        s.setsockopt(zmq.LINGER, LINGER_MS if bind else 0)
        s.setsockopt(zmq.SNDHWM, HWM)
        s.setsockopt(zmq.RCVHWM, HWM)
        if identity:
            s.setsockopt(zmq.IDENTITY, identity)
        if bind:
            s.bind(bind)
        else:
            s.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            s.connect(connect)
        return s

    def forward(self, source: zmq.Socket[bytes]) -> None:
        """Relay the messages waiting on ``source`` (at most a batch, so no
        channel starves the others)."""
        target = self.peer[source]
        rewrite = self.channel[source] == "shell"
        from_front = source is self.front.get("shell")
        for _ in range(64):
            try:
                frames = source.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if rewrite:
                try:
                    frames = self.expressions.request(frames) if from_front else self.expressions.reply(frames)
                except Exception:  # anything odd is forwarded as it came
                    pass
            try:
                target.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                pass  # the peer's queue is full (HWM): dropped, as a PUB would
            except zmq.ZMQError:
                pass

    def interrupt(self, pid: int) -> None:
        if self.interrupter is None:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            return
        self.interrupts += 1
        try:
            self.interrupter.send_multipart(interrupt_message(self.signer, self.session, self.interrupts), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def run(self, pid: int, wakeup: int) -> int:
        """Relay until the kernel ``pid`` exited; returns its exit code."""
        poller = zmq.Poller()
        for s in self.peer:
            poller.register(s, zmq.POLLIN)
        if self.interrupter is not None:
            poller.register(self.interrupter, zmq.POLLIN)
        poller.register(wakeup, zmq.POLLIN)
        status: int | None = None
        kill_at: float | None = None
        drain_until = 0.0
        while True:
            if status is None:
                timeout = None if kill_at is None else max(0.0, kill_at - time.monotonic()) * 1000
            else:
                timeout = max(0.0, drain_until - time.monotonic()) * 1000
            try:
                events = poller.poll(timeout)
            except zmq.ZMQError:
                events = []
            for s, _ in events:
                if s == wakeup:
                    for signum in _read_signals(wakeup):
                        if signum == signal.SIGINT and status is None:
                            self.interrupt(pid)
                        elif signum == signal.SIGTERM and status is None and kill_at is None:
                            _kill(pid, signal.SIGTERM)
                            kill_at = time.monotonic() + TERM_GRACE_S
                elif s is self.interrupter:
                    _discard(s)  # the interrupt_reply is ours, not the gateway's
                elif isinstance(s, zmq.Socket):
                    self.forward(s)
            if status is None:
                status = _reap(pid)
                if status is not None:
                    drain_until = time.monotonic() + DRAIN_S
                elif kill_at is not None and time.monotonic() >= kill_at:
                    _kill(pid, signal.SIGKILL)
                    kill_at = time.monotonic() + 3600
            elif not events or time.monotonic() >= drain_until:
                return status

    def close(self) -> None:
        for s in [*self.peer, *([self.interrupter] if self.interrupter is not None else [])]:
            s.close()
        self.ctx.term()


def _read_signals(fd: int) -> list[int]:
    try:
        return list(os.read(fd, 512))
    except (BlockingIOError, InterruptedError):
        return []


def _discard(s: zmq.Socket[bytes]) -> None:
    while True:
        try:
            s.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> int | None:
    try:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 1
    return exit_status(wait_status) if done == pid else None


def _remove(directory: str) -> None:
    try:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
    except OSError:
        pass


def main(args: list[str] | None = None) -> int:
    try:
        transport, interrupt, conn_file, argv = parse_args(sys.argv[1:] if args is None else args)
    except ValueError as exc:
        print(f"kernelgw shim: {exc}", file=sys.stderr)
        print(
            "usage: python -m kernelgw_kernel.shim [--transport tcp|ipc] [--interrupt signal|message] "
            "[--connection-file PATH] -- ARGV... ({connection_file} in ARGV is the kernel's own file)",
            file=sys.stderr,
        )
        return 2
    with open(conn_file, encoding="utf-8") as f:
        front = json.load(f)
    directory, back = private_connection(front, transport)
    kernel_file = os.path.join(directory, "kernel.json")
    fd = os.open(kernel_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(back, f)

    # signals arrive as bytes on a pipe the poller watches: nothing runs in a handler
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, lambda *_: None)

    shim = Shim(front, back, interrupt)
    command = substitute(argv, kernel_file)
    try:
        # the kernel gets the default dispositions back (posix_spawn resets
        # handled signals to SIG_DFL in the child)
        pid = os.posix_spawnp(command[0], command, dict(os.environ))
    except OSError as exc:
        print(f"kernelgw shim: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        shim.close()
        _remove(directory)
        return 127
    try:
        status = shim.run(pid, read_fd)
    finally:
        shim.close()
        _remove(directory)
    return status


if __name__ == "__main__":
    sys.exit(main())
