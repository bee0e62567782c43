"""One host uid per session (`UidAllocator`).

The Linux kernel counts some limits per uid across the whole host (inotify
instances, POSIX message queue bytes, RLIMIT_NPROC under runc, ...): kernels that
shared one uid shared those limits, so one session could exhaust them for every
other. Each session's kernel therefore runs as a uid of its own, taken from
``kernel_uid_range``.

The engine is the host's record of who holds which uid: every container started
for a session carries its uid in the label ``LABEL_UID``, and a uid is held while
any container with it exists, whichever gateway made it. Choosing one is done
under a host-wide ``flock`` (every gateway and worker process on the host takes
the same file), and the choice is written as a short reservation until the
container that carries the label exists, so two gateways never pick the same
uid between listing the engine and creating their container.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kernelgw.config import parse_uid_range
from kernelgw.errors import KernelStartFailed, UidsExhausted

__all__ = ["UidAllocator", "choose_uid", "parse_uid_range"]

RESERVATION_S = 300.0
"""How long a chosen uid is held without a container (a start's whole time,
with room: a gateway that died mid-start gives it back after this)."""
LOCK_FILE = "uids.lock"
RESERVATIONS_FILE = "uids.json"


def choose_uid(uids: range, held: Mapping[int, str], owner: str, prefer: int | None = None) -> int:
    """The uid for ``owner``: the one it holds already, else ``prefer`` when free,
    else the lowest free one. ``held`` maps each uid in use to its holder."""
    for uid, holder in held.items():
        if holder == owner:
            return uid
    if prefer is not None and prefer in uids and prefer not in held:
        return prefer
    for uid in uids:
        if uid not in held:
            return uid
    raise UidsExhausted(
        f"Every uid of kernel_uid_range ({uids.start}-{uids.stop - 1}, {len(uids)} uids) is held by a "
        "running session on this host. End sessions you no longer need, or widen the gateway's "
        "setting kernel_uid_range."
    )


@dataclass
class UidAllocator:
    """Chooses a session's uid host-wide. Blocking (file lock, engine listing):
    call it on the backend's thread pool, never on the event loop."""

    uids: range
    state_dir: Path
    """A directory every gateway on the host shares (the lock and reservations)."""
    held_by_containers: Callable[[], dict[int, str]]
    """The engine's containers' uids and their holders (``gateway/session``)."""

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise KernelStartFailed(
                f"The gateway cannot use uid_state_dir {str(self.state_dir)!r} to choose the session's uid ({exc}); "
                "make it a writable directory every gateway of this host shares."
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _reservations(self) -> dict[int, tuple[str, float]]:
        """Live reservations (uid: holder, expiry); expired ones are dropped."""
        try:
            raw = json.loads((self.state_dir / RESERVATIONS_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        now = time.time()
        found: dict[int, tuple[str, float]] = {}
        for uid, (holder, expires) in raw.items():
            if float(expires) > now:
                found[int(uid)] = (str(holder), float(expires))
        return found

    def _write(self, reservations: dict[int, tuple[str, float]]) -> None:
        path = self.state_dir / RESERVATIONS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(uid): list(value) for uid, value in reservations.items()}))
        tmp.replace(path)

    def acquire(self, owner: str, prefer: int | None = None) -> int:
        """The uid ``owner`` holds or now reserves (`release` once its container
        exists). Raises UidsExhausted when the range is all held."""
        with self._locked():
            reservations = self._reservations()
            held = {uid: holder for uid, (holder, _) in reservations.items()}
            held.update(self.held_by_containers())
            uid = choose_uid(self.uids, held, owner, prefer)
            reservations[uid] = (owner, time.time() + RESERVATION_S)
            self._write(reservations)
            return uid

    def release(self, owner: str) -> None:
        """Drop ``owner``'s reservation: its containers now carry the uid, or it
        made none (then the uid is free again)."""
        with self._locked():
            reservations = self._reservations()
            kept = {uid: value for uid, value in reservations.items() if value[0] != owner}
            if kept != reservations:
                self._write(kept)
