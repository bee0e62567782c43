"""Which gateway process owns a gateway name's kernels on this host.

Kernel containers are found by the label ``kernelgw.gateway=<name>`` on the
local engine, and a gateway removes the containers of its name at start-up
(the kernels of a gateway that died). Two live gateways with one name would
remove each other's kernels. So each gateway holds an exclusive ``flock`` on
``<runtime_dir>/<name>.lock`` for as long as it lives: the operating system
drops it when the process ends, however it ends (SIGTERM, kill -9, OOM), which
makes a dead owner provably dead and a live one provably alive. The file says
who holds it, for the message a second gateway gets.

Scope: one host and its engine. Gateways on other hosts have other engines and
never see these containers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from kernelgw.errors import GatewayNameInUse


@dataclass(frozen=True)
class Owner:
    """What the lock file says about the process holding it."""

    pid: int
    host: str
    address: str
    started_at: str

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, serving {self.address}, since {self.started_at}"


def lock_path(runtime_dir: Path, gateway_name: str) -> Path:
    # beside <runtime_dir>/<name>/, which the gateway removes on shutdown
    return runtime_dir / f"{gateway_name}.lock"


class InstanceLock:
    """The gateway name's lock on this host. ``acquire`` before touching any
    container of the name; ``release`` (or process exit) gives it up."""

    def __init__(self, runtime_dir: Path, gateway_name: str) -> None:
        self.gateway_name = gateway_name
        self.path = lock_path(runtime_dir, gateway_name)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, address: str) -> None:
        """Take the lock or raise :class:`GatewayNameInUse` naming its holder."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_owner(fd)
            os.close(fd)
            raise GatewayNameInUse(self._in_use_message(holder)) from None
        except BaseException:
            os.close(fd)
            raise
        owner = Owner(
            pid=os.getpid(),
            host=socket.gethostname(),
            address=address,
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(owner)).encode(), 0)
        self._fd = fd

    def check(self) -> None:
        """Raise :class:`GatewayNameInUse` if another process holds the lock now
        (for a friendly refusal before a server binds its port); holds nothing."""
        probe = InstanceLock(self.path.parent, self.gateway_name)
        probe.acquire(address="(probe)")
        probe.release()

    def release(self) -> None:
        # The file stays: unlinking a lock file races with a process that has
        # opened it and waits to lock it.
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _in_use_message(self, holder: Owner | None) -> str:
        who = holder.describe() if holder else "its details are not recorded"
        return (
            f"Another gateway named {self.gateway_name!r} is running on this host ({who}). "
            "Starting a second one with the same name would remove its kernels. Stop that one, "
            "or give this one another name: --gateway-name NAME or KERNELGW_GATEWAY_NAME=NAME "
            f"(lock file: {self.path})."
        )


def _read_owner(fd: int) -> Owner | None:
    with contextlib.suppress(OSError, ValueError, TypeError):
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return Owner(**data) if isinstance(data, dict) else None
    return None
