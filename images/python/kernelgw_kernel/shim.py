"""A relay in front of a kernel that cannot serve kernelgw's sockets itself.

``python -m kernelgw_kernel.shim [--transport tcp|ipc] [--interrupt signal|message]
[--connection-file /conn/kernel.json] [--fence CODE [--fence-when always|interrupted]]
-- ARGV...``

The gateway connects to five ipc sockets named in ``/conn/kernel.json``. Some
kernels cannot bind them: Deno rejects an ipc address, JJava's JeroMQ only
emulates ipc over TCP. Some cannot be interrupted by SIGINT (the gateway's
interrupt), and none but IPython can evaluate the Python expression with which
the gateway asks which workspace files a cell wrote. The shim:

- binds the five ipc sockets of the connection file (the front);
- writes a private connection file for the real kernel (same key; 127.0.0.1 on
  free TCP ports, or ipc sockets in a private directory under /tmp) and starts
  ARGV with every ``{connection_file}`` replaced by its path;
- relays every channel both ways in one thread with one poller (shell,
  control, stdin: ROUTER front, DEALER back, the gateway's routing
  identities kept by the shim and put back on what the kernel sends, see
  `Routes`; iopub: XPUB front, XSUB back; heartbeat: ROUTER front, DEALER
  back, so the kernel itself answers the pings), message frames unchanged
  but for the two below;
- answers two of the gateway's ``user_expressions`` itself and strips them
  from the execute_request (re-signed): ``artifacts`` (the files in /workspace
  that changed since the last non-silent execute_request passed; on every
  reply, whatever its status) and ``kernelgw_end`` (a quoted nonce, the proof
  that a reply answered its request; its own text, on replies with status
  ``ok``, as IPython evaluates user_expressions only then);
- on SIGINT forwards SIGINT to the kernel (``--interrupt signal``) or sends a
  signed ``interrupt_request`` on the control channel from its own socket
  (``--interrupt message``; the reply is dropped);
- with ``--fence CODE`` (code in the kernel's language that prints
  ``{marker}``), holds each cell's idle until all of the cell's output is out,
  for kernels that publish some of it after the idle (Deno; see `Fences`);
  with ``--fence-when interrupted`` too, only the idle of a cell it interrupted
  (JJava, IRkernel: what a printing loop left in their buffers);
- starts the kernel with its fd 1 and fd 2 on pipes and publishes what comes
  as the running cell's ``stream`` output, before the cell's reply and idle;
  while no cell runs it goes to the container's log (`kernelgw_kernel.fdrelay`);
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
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from kernelgw_kernel.fdrelay import FdRelay, log_fd
from kernelgw_kernel.wire import DELIM, dumps, is_idle, own_header, split

if TYPE_CHECKING:
    import zmq
# else: imported by `main` once the kernel is on its way (`_import_zmq`), so
# the kernel's start does not wait for pyzmq's (about 40 ms)

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
HWM = 100_000
"""Messages queued per peer and direction, as the gateway and ipykernel use
(zmq's default of 1000 drops iopub output in a flood)."""
RECONNECT_IVL_MS = 10
"""The kernel binds its ports some time after it starts: try again soon (zmq's
default of 100 ms would add up to 100 ms to every cold start)."""
TERM_GRACE_S = 5.0
"""After SIGTERM, how long the kernel may take before it is killed."""
STARTED_BY = frozenset({"execute_input", "stream", "display_data", "update_display_data", "execute_result", "error"})
"""The iopub messages that show a cell has started in the kernel (`Expressions.started`)."""
NOT_PASSED_ON = "kernelgw shim: SIGINT while no cell runs: not passed on"
"""Said on stderr (the container's log) for a SIGINT that finds no cell running."""
DRAIN_S = 0.2
"""After the kernel exited, how long what it sent last is still relayed."""
LINGER_MS = 1000
FENCE_TIMEOUT_S = 2.0
"""How long a cell's idle waits for its fence's marker (`Fences`)."""
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


class Options(NamedTuple):
    transport: str
    interrupt: str
    connection_file: str
    fence: str
    argv: list[str]
    fence_when: str = "always"


def parse_args(args: list[str]) -> Options:
    """The command line's options; raises ValueError with a usage message."""
    values = {
        "--transport": "tcp",
        "--interrupt": "signal",
        "--connection-file": "/conn/kernel.json",
        "--fence": "",
        "--fence-when": "always",
    }
    i = 0
    while i < len(args) and args[i] != "--":
        opt, eq, value = args[i].partition("=")
        if opt not in values:
            raise ValueError(f"unknown option {args[i]!r}")
        if not eq:
            i += 1
            if i >= len(args):
                raise ValueError(f"{opt} needs a value")
            value = args[i]
        values[opt] = value
        i += 1
    if values["--transport"] not in ("tcp", "ipc"):
        raise ValueError("--transport is tcp or ipc")
    if values["--interrupt"] not in ("signal", "message"):
        raise ValueError("--interrupt is signal or message")
    if values["--fence"] and "{marker}" not in values["--fence"]:
        raise ValueError("--fence is code that prints {marker}")
    if values["--fence-when"] not in ("always", "interrupted"):
        raise ValueError("--fence-when is always or interrupted")
    argv = args[i + 1 :]
    if not argv:
        raise ValueError("no kernel command after --")
    return Options(
        values["--transport"],
        values["--interrupt"],
        values["--connection-file"],
        values["--fence"],
        argv,
        values["--fence-when"],
    )


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
        self.running: str | None = None
        """The msg_id of the cell the kernel runs (a non-silent execute_request
        whose reply has not come): a SIGINT while none runs is not passed on."""
        self.started = False
        """The running cell has started in the kernel (its execute_input, or any
        output of it, came): an interrupt now lands inside the cell."""
        self.interrupted = False
        """The shim sent an interrupt_request since the last cell started: the
        cell's failed reply is reported as Python's ``KeyboardInterrupt`` (Deno
        says ``Error: Execution failed``, JJava ``EvaluationInterruptedException``),
        which is how the gateway tells an interrupted cell from a failed one."""

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
            self.interrupted = False
            self.started = False
            msg_id = header.get("msg_id")
            self.running = msg_id if isinstance(msg_id, str) else None
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
        return self._with_content(frames, i, content)

    def started_by(self, frames: list[bytes]) -> bool:
        """Whether this iopub message from the kernel is the first sign that the
        running cell has started (then `started` is set)."""
        if self.running is None or self.started:
            return False
        i = split(frames)
        if i is None or len(frames) < i + 4:
            return False
        try:
            header, parent = json.loads(frames[i + 2]), json.loads(frames[i + 3])
        except ValueError:
            return False
        if not isinstance(header, dict) or not isinstance(parent, dict) or parent.get("msg_id") != self.running:
            return False
        if header.get("msg_type") not in STARTED_BY:
            return False
        self.started = True
        return True

    def reply(self, frames: list[bytes]) -> list[bytes]:
        """An execute_reply from the kernel, with the answers to what its
        request asked of us added (the same frames otherwise)."""
        i = split(frames)
        if i is None:
            return frames
        header = json.loads(frames[i + 2])
        if not isinstance(header, dict) or header.get("msg_type") != "execute_reply":
            return frames
        parent = json.loads(frames[i + 3])
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        if msg_id is not None and msg_id == self.running:
            self.running = None
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
        if self.interrupted and content.get("status") in ("error", "abort"):
            was = ": ".join(str(content.get(k) or "") for k in ("ename", "evalue") if content.get(k))
            content.update(status="error", ename="KeyboardInterrupt", evalue=was or "interrupted")
            content.setdefault("traceback", [])
        content["user_expressions"] = answers
        return self._with_content(frames, i, content)

    def _with_content(self, frames: list[bytes], i: int, content: dict[str, Any]) -> list[bytes]:
        """``frames`` (delimiter at ``i``) with ``content`` in place of theirs, signed again."""
        new_content = dumps(content)
        signature = self.signer.sign([frames[i + 2], frames[i + 3], frames[i + 4], new_content])
        return [*frames[: i + 1], signature, frames[i + 2], frames[i + 3], frames[i + 4], new_content, *frames[i + 6 :]]


class Routes:
    """Who asked what. Some kernels answer only the last routing identity of a
    request (Deno does), so the kernel never sees the gateway's: the shim
    takes them off each request (shell, control, stdin), remembers them by the
    request's msg_id, and puts them back on what the kernel sends, found by
    its parent's msg_id (a stdin ``input_request``'s parent is the cell's
    execute_request, whose sender's shell identity is its stdin identity too,
    as jupyter_client sets them). The heartbeat is not a Jupyter message:
    its envelopes wait in order (the kernel echoes pings one by one)."""

    def __init__(self, limit: int = PENDING_MAX * 4) -> None:
        self.limit = limit
        self.by_msg_id: OrderedDict[str, list[bytes]] = OrderedDict()
        self.pings: deque[list[bytes]] = deque(maxlen=limit)

    def inbound(self, frames: list[bytes]) -> list[bytes]:
        """A request from the gateway, without its identities (the frames as
        they came when they are not a message)."""
        i = split(frames)
        if i is None or i == 0:
            return frames
        try:
            msg_id = json.loads(frames[i + 2]).get("msg_id")
        except (ValueError, AttributeError):
            msg_id = None
        if isinstance(msg_id, str):
            self.by_msg_id[msg_id] = frames[:i]
            self.by_msg_id.move_to_end(msg_id)
            while len(self.by_msg_id) > self.limit:
                self.by_msg_id.popitem(last=False)
        return frames[i:]

    def outbound(self, frames: list[bytes], channel: str) -> list[bytes] | None:
        """What the kernel sent, with the identities of the request it answers;
        None when it answers nothing the shim relayed (it cannot be routed)."""
        i = split(frames)
        if i is None:
            return None
        try:
            parent = json.loads(frames[i + 3])
            msg_id = parent.get("msg_id")
            msg_type = json.loads(frames[i + 2]).get("msg_type")
        except (ValueError, AttributeError):
            return None
        if not isinstance(msg_id, str):
            return None
        if channel != "stdin" and isinstance(msg_type, str) and msg_type.endswith("_reply"):
            idents = self.by_msg_id.pop(msg_id, None)
        else:
            idents = self.by_msg_id.get(msg_id)
        if idents is None:
            return None
        return [*idents, *frames[i:]]

    def ping(self, frames: list[bytes]) -> list[bytes]:
        """A heartbeat from the gateway: its envelope (up to the empty frame a
        REQ socket adds) waits for the echo."""
        try:
            i = frames.index(b"")
        except ValueError:
            i = len(frames) - 1
        self.pings.append(frames[: i + 1])
        return frames[i:] if frames[i] == b"" else [b"", *frames[i:]]

    def pong(self, frames: list[bytes]) -> list[bytes] | None:
        if not self.pings:
            return None
        envelope = self.pings.popleft()
        body = frames[1:] if frames and frames[0] == b"" else frames
        return [*envelope, *body] if envelope[-1] == b"" else [*envelope[:-1], *body]


class Fences:
    """Puts a cell's idle after all of its output, for kernels that publish
    some output after the idle (``--fence CODE``).

    Deno's kernel sends printed text through a queue that another task empties
    onto iopub, with the parent of whatever request it is running by then: the
    idle often overtakes the text (in a loaded container, 40 of 40 cells that
    printed 100 lines had some after their idle, up to 75 ms later). The
    gateway ends a cell at its idle and would lose the rest.

    A fence starts at whichever of a non-silent cell's execute_reply (shell)
    and idle (iopub) reaches the shim first: the two come on different sockets,
    and Deno's idle often comes first (5% of cells, loaded or not; a fence
    started only at the reply let that idle through, and the cell lost the
    rest of its output). The shim sends the kernel a silent request of its own
    (the probe) that prints a marker through the same queue, and holds the
    cell's idle. Until the marker comes, output under the cell's parent goes
    on, output under the probe's is the cell's (re-parented, re-signed), the
    probe's status, input and marker are dropped, and anything else waits;
    then the cell's idle goes out, followed by what waited (seen again, so a
    waiting cell's idle starts that cell's fence). The probe's reply is
    dropped, unless it says the probe failed: then, as after
    ``FENCE_TIMEOUT_S`` without the marker, the idle goes out anyway. (Deno parents even a cell's execute_result by the request it runs
    when the result is sent, which can be the probe: it is the cell's too. The
    probe prints only: no result of its own.)

    Probes wait in `outbox` for the relay to send them to the kernel's shell.

    ``only_interrupted`` (``--fence-when interrupted``): only a cell the shim
    interrupted is fenced. JJava and IRkernel publish what an interrupted
    printing loop left in their output buffers with the parent of the next
    request: without a fence that was the next cell's first output; with one it
    is the probe's, which is the interrupted cell's. Other cells pay nothing."""

    def __init__(self, signer: Signer, template: str, session: str, *, only_interrupted: bool = False) -> None:
        self.signer = signer
        self.template = template
        self.session = session
        self.only_interrupted = only_interrupted
        self.interrupted: OrderedDict[str, None] = OrderedDict()
        """Cells (msg_id) the shim interrupted (`interrupted_cell`)."""
        self.cells: OrderedDict[str, bytes] = OrderedDict()
        """msg_id of non-silent execute_requests not fenced yet -> their header frame."""
        self.probes: OrderedDict[str, None] = OrderedDict()
        """Every probe sent (their late messages are dropped)."""
        self.outbox: list[list[bytes]] = []
        """Probes for the kernel's shell socket, not sent yet."""
        self.count = 0
        self.active: dict[str, Any] | None = None

    def interrupted_cell(self, msg_id: str) -> None:
        """The shim interrupted ``msg_id``: it is fenced, whatever the mode."""
        self.interrupted[msg_id] = None
        while len(self.interrupted) > PENDING_MAX:
            self.interrupted.popitem(last=False)

    def _wanted(self, cell: str) -> bool:
        """Whether ``cell`` (not fenced yet) gets a fence; if not, it is forgotten."""
        if not self.only_interrupted:
            return True
        if cell in self.interrupted:
            del self.interrupted[cell]
            return True
        self.cells.pop(cell, None)
        return False

    @property
    def deadline(self) -> float | None:
        return None if self.active is None else float(self.active["deadline"])

    def request(self, frames: list[bytes]) -> None:
        """A request on its way to the kernel (identities already taken off)."""
        i = split(frames)
        if i is None:
            return
        header = json.loads(frames[i + 2])
        if not isinstance(header, dict) or header.get("msg_type") != "execute_request":
            return
        content = json.loads(frames[i + 5])
        if isinstance(content, dict) and not content.get("silent") and isinstance(header.get("msg_id"), str):
            self.cells[header["msg_id"]] = frames[i + 2]
            while len(self.cells) > PENDING_MAX:
                self.cells.popitem(last=False)

    def reply(self, frames: list[bytes]) -> bool:
        """A shell message from the kernel: whether to drop it (a probe's
        reply). A cell's execute_reply starts its fence unless its idle did."""
        i = split(frames)
        if i is None:
            return False
        parent = json.loads(frames[i + 3])
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        if msg_id in self.probes:
            fence = self.active
            if fence is not None and msg_id == fence["probe"]:
                content = json.loads(frames[i + 5])
                if not isinstance(content, dict) or content.get("status") != "ok":
                    # the probe did not run (Deno aborts what follows an
                    # interrupt): its marker will not come, end now (`expire`)
                    fence["deadline"] = time.monotonic()
            return True
        if not isinstance(msg_id, str) or msg_id not in self.cells or self.active is not None:
            return False
        if json.loads(frames[i + 2]).get("msg_type") != "execute_reply":
            return False
        if self._wanted(msg_id):
            self._start(msg_id)
        return False

    def take_probes(self) -> list[list[bytes]]:
        """The probes to send the kernel now (the outbox emptied)."""
        probes, self.outbox = self.outbox, []
        return probes

    def _start(self, cell: str) -> None:
        """Fence ``cell``: a probe into the outbox, its idle held from now on."""
        self.count += 1
        marker = f"kernelgw-fence-{self.session}-{self.count}"
        header = own_header(f"{self.session}_fence_{self.count}", "execute_request", self.session)
        content = {
            "code": self.template.replace("{marker}", marker),
            "silent": True,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        parts = [dumps(header), b"{}", b"{}", dumps(content)]
        self.probes[header["msg_id"]] = None
        while len(self.probes) > PENDING_MAX:
            self.probes.popitem(last=False)
        self.active = {
            "cell": cell,
            "cell_header": self.cells.pop(cell),
            "probe": header["msg_id"],
            "marker": marker,
            "idle": None,
            "held": [],
            "deadline": time.monotonic() + FENCE_TIMEOUT_S,
        }
        self.outbox.append([DELIM, self.signer.sign(parts), *parts])

    def iopub(self, frames: list[bytes]) -> list[list[bytes]]:
        """What to publish now for a message the kernel published."""
        fence = self.active
        i = split(frames)
        if i is None:
            return [frames] if fence is None else self._hold(frames)
        parent = json.loads(frames[i + 3])
        parent_id = parent.get("msg_id") if isinstance(parent, dict) else None
        if fence is None:
            if parent_id in self.probes:
                return []
            if isinstance(parent_id, str) and parent_id in self.cells and is_idle(frames, i):
                if not self._wanted(parent_id):
                    return [frames]
                self._start(parent_id)  # the idle overtook the reply: fence now
                assert self.active is not None
                self.active["idle"] = frames
                return []
            return [frames]
        header = json.loads(frames[i + 2])
        msg_type = header.get("msg_type") if isinstance(header, dict) else None
        if parent_id == fence["cell"]:
            if is_idle(frames, i):
                fence["idle"] = frames
                return []
            return [frames]
        if parent_id != fence["probe"]:
            return [] if parent_id in self.probes else self._hold(frames)
        if msg_type in ("status", "execute_input"):
            return []
        content = json.loads(frames[i + 5])
        done = False
        if msg_type == "stream" and isinstance(content, dict) and fence["marker"] in str(content.get("text")):
            done = True
            content["text"] = str(content["text"]).replace(fence["marker"] + "\n", "").replace(fence["marker"], "")
            if not content["text"]:
                return self.finish()
        out = [*frames[: i + 3], fence["cell_header"], frames[i + 4], dumps(content), *frames[i + 6 :]]
        out[i + 1] = self.signer.sign(out[i + 2 : i + 6])
        return [out, *self.finish()] if done else [out]

    def _hold(self, frames: list[bytes]) -> list[list[bytes]]:
        assert self.active is not None
        self.active["held"].append(frames)
        return []

    def finish(self) -> list[list[bytes]]:
        """End the active fence: its cell's idle, then what waited, seen again
        (a waiting cell's idle starts its own fence, which holds what follows)."""
        fence, self.active = self.active, None
        if fence is None:
            return []
        out = [fence["idle"]] if fence["idle"] is not None else []
        for frames in fence["held"]:
            out.extend(self.iopub(frames))
        return out


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
    parts = [dumps(header), b"{}", b"{}", b"{}"]
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
    def __init__(
        self,
        front: dict[str, Any],
        back: dict[str, Any],
        interrupt: str,
        fence: str = "",
        pipes: dict[str, int] | None = None,
        fence_when: str = "always",
    ) -> None:
        self.interrupt_mode = interrupt
        self.signer = Signer(str(front.get("key", "")).encode(), str(front.get("signature_scheme", "hmac-sha256")))
        self.session = os.urandom(8).hex()
        self.interrupts = 0
        self.interrupt_waiting: str | None = None
        """The cell (msg_id) a SIGINT came for before the kernel started it (`interrupt`)."""
        self.pid = 0
        """The kernel's process (set by `run`)."""
        self.ctx = zmq.Context()
        f, b = addresses(front), addresses(back)
        identity = b"kernelgw-shim-" + self.session.encode()
        # a kernel routes stdin messages to the identity a shell request came
        # from: the shell and stdin sockets toward it share one
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
        self.routes = Routes()
        self.fences = (
            Fences(self.signer, fence, self.session, only_interrupted=fence_when == "interrupted") if fence else None
        )
        logs = {"stdout": log_fd(1), "stderr": log_fd(2)}
        self.output = FdRelay(self.signer, self.session, pipes or {}, logs)
        """The kernel's fd 1 and fd 2 (``pipes``: stream name -> read end) as the running cell's output."""
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
        channel = self.channel[source]
        from_front = source is self.front[channel]
        for _ in range(64):
            try:
                frames = source.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                out = self.route(frames, channel, from_front)
            except Exception:  # anything odd is forwarded as it came
                out = [frames]
            for message in out:
                if target is self.front["iopub"]:
                    self.publish(message)
                else:
                    if channel == "shell" and not from_front:
                        self._publish(self.output.before(message, "shell"))
                    self._send(target, message)
            self.send_probes()

    def publish(self, message: list[bytes]) -> None:
        """A kernel's iopub message to the gateway, after what the kernel wrote
        to its fd 1 and 2 before it (when it belongs to the running cell)."""
        self._publish(self.output.before(message))
        self._send(self.front["iopub"], message)

    def _publish(self, messages: list[list[bytes]]) -> None:
        for message in messages:
            self._send(self.front["iopub"], message)

    def send_probes(self) -> None:
        """The fences' probes to the kernel's shell (a cell's reply or idle started one)."""
        if self.fences is not None:
            for probe in self.fences.take_probes():
                self._send(self.back["shell"], probe)

    @staticmethod
    def _send(target: zmq.Socket[bytes], frames: list[bytes]) -> None:
        try:
            target.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError:  # Again: the peer's queue is full (HWM), dropped as a PUB would
            pass

    def expire(self) -> None:
        """A fence whose marker did not come in time ends anyway."""
        if self.fences is not None and self.fences.deadline is not None and time.monotonic() >= self.fences.deadline:
            for message in self.fences.finish():
                self.publish(message)
            self.send_probes()

    def route(self, frames: list[bytes], channel: str, from_front: bool) -> list[list[bytes]]:
        """The messages to send on for ``frames`` (none: unroutable, or held)."""
        if channel == "iopub":
            if not from_front and self.expressions.started_by(frames):
                if self.interrupt_waiting is not None and self.interrupt_waiting == self.expressions.running:
                    self._interrupt(self.pid)
                self.interrupt_waiting = None
            if from_front or self.fences is None:
                return [frames]
            return self.fences.iopub(frames)
        if channel == "hb":
            routed = self.routes.ping(frames) if from_front else self.routes.pong(frames)
            return [] if routed is None else [routed]
        if from_front:
            frames = self.routes.inbound(frames)
            if channel == "shell":
                frames = self.expressions.request(frames)
                self.output.request(frames)
                if self.fences is not None:
                    self.fences.request(frames)
            return [frames]
        if channel == "shell" and self.fences is not None and self.fences.reply(frames):
            return []
        routed = self.routes.outbound(frames, channel)
        if routed is None:
            return []
        return [self.expressions.reply(routed) if channel == "shell" else routed]

    def interrupt(self, pid: int) -> None:
        """A SIGINT for the kernel: passed on only while a cell runs in it. A cell
        whose request was sent but which has not started (no execute_input yet)
        gets it when it starts: an interrupt that lands in the kernel's handling
        of a request, outside the cell, killed or hung IRkernel."""
        self.interrupt_waiting = None
        if self.expressions.running is None:
            # no cell runs: nothing to interrupt; said on stderr, the container's (bounded) log
            print(NOT_PASSED_ON, file=sys.stderr, flush=True)
            return
        if not self.expressions.started:
            self.interrupt_waiting = self.expressions.running
            return
        self._interrupt(pid)

    def _interrupt(self, pid: int) -> None:
        if self.fences is not None and self.expressions.running is not None:
            self.fences.interrupted_cell(self.expressions.running)
        if self.interrupter is None:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            return
        self.interrupts += 1
        self.expressions.interrupted = True
        try:
            self.interrupter.send_multipart(interrupt_message(self.signer, self.session, self.interrupts), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def run(self, pid: int, wakeup: int) -> int:
        """Relay until the kernel ``pid`` exited; returns its exit code."""
        self.pid = pid
        poller = zmq.Poller()
        for s in self.peer:
            poller.register(s, zmq.POLLIN)
        if self.interrupter is not None:
            poller.register(self.interrupter, zmq.POLLIN)
        poller.register(wakeup, zmq.POLLIN)
        for fd in self.output.fds:
            poller.register(fd, zmq.POLLIN)
        status: int | None = None
        kill_at: float | None = None
        drain_until = 0.0
        while True:
            wake = drain_until if status is not None else kill_at
            if self.fences is not None and self.fences.deadline is not None:
                wake = self.fences.deadline if wake is None else min(wake, self.fences.deadline)
            timeout = None if wake is None else int(max(0.0, wake - time.monotonic()) * 1000)
            try:
                events = poller.poll(timeout)
            except zmq.ZMQError:
                events = []
            # signals first: a SIGINT sent between two cells must find no cell
            # running, even when the next cell's request came in the same poll
            events.sort(key=lambda event: event[0] != wakeup)
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
                else:
                    self._publish(self.output.readable(s))
                    if s not in self.output.fds:  # every writer is gone
                        poller.unregister(s)
            self.expire()
            if status is None:
                status = _reap(pid)
                if status is not None:
                    drain_until = time.monotonic() + DRAIN_S
                elif kill_at is not None and time.monotonic() >= kill_at:
                    _kill(pid, signal.SIGKILL)
                    kill_at = time.monotonic() + 3600
            elif not events or time.monotonic() >= drain_until:
                if self.fences is not None:
                    for message in self.fences.finish():
                        self.publish(message)
                self._publish(self.output.drain())
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


def _import_zmq() -> None:
    global zmq
    import zmq


def main(args: list[str] | None = None) -> int:
    try:
        options = parse_args(sys.argv[1:] if args is None else args)
    except ValueError as exc:
        print(f"kernelgw shim: {exc}", file=sys.stderr)
        print(
            "usage: python -m kernelgw_kernel.shim [--transport tcp|ipc] [--interrupt signal|message] "
            "[--connection-file PATH] [--fence CODE [--fence-when always|interrupted]] -- ARGV... "
            "({connection_file} in ARGV is the "
            "kernel's own file; CODE prints {marker})",
            file=sys.stderr,
        )
        return 2
    with open(options.connection_file, encoding="utf-8") as f:
        front = json.load(f)
    directory, back = private_connection(front, options.transport)
    kernel_file = os.path.join(directory, "kernel.json")
    fd = os.open(kernel_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(back, f)

    # signals arrive as bytes on a pipe the poller watches: nothing runs in a handler
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, lambda *_: None)

    command = substitute(options.argv, kernel_file)
    # the kernel's fd 1 and 2 on pipes the relay reads (`kernelgw_kernel.fdrelay`)
    out_r, out_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    for w in (out_w, err_w):
        os.set_blocking(w, True)  # the kernel's writes wait for the relay, as on any pipe
    pipes = {"stdout": out_r, "stderr": err_r}
    try:
        # the kernel first, the relay while it starts (zmq connects when the
        # kernel has bound; a signal meanwhile waits in the pipe). The kernel
        # gets the default dispositions back (posix_spawn resets handled
        # signals to SIG_DFL in the child)
        pid = os.posix_spawnp(
            command[0],
            command,
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)],
        )
    except OSError as exc:
        print(f"kernelgw shim: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        _remove(directory)
        return 127
    finally:
        os.close(out_w)
        os.close(err_w)
    try:
        _import_zmq()
        shim = Shim(front, back, options.interrupt, options.fence, pipes, options.fence_when)
    except BaseException:
        _kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _remove(directory)
        raise
    try:
        status = shim.run(pid, read_fd)
    finally:
        shim.close()
        _remove(directory)
    return status


if __name__ == "__main__":
    sys.exit(main())
