"""The limits a peer's container runs under, read from ``docker inspect`` during the run."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    "network",
    "memory",
    "cpus",
    "pids",
    "read-only root",
    "code runs as",
    "capabilities",
    "no-new-privs",
    "runtime",
)

WRAPPERS = frozenset({"docker-init", "tini", "sleep", "sh"})
"""Processes that only hold a container open or reap children: not where the code runs."""


def _code_user(configured: str, processes: list[tuple[str, str]] | None) -> str:
    """Who user code runs as: the uids of the container's working processes (``docker top``),
    else the configured user (a container whose code arrives by ``docker exec`` runs it as that)."""
    uids = sorted({uid for uid, comm in processes or [] if comm not in WRAPPERS})
    if uids:
        return ", ".join("root" if u == "0" else f"uid {u}" for u in uids)
    user = configured.split(":")[0]
    return "root" if user in ("", "0", "root") else f"uid {user}"


def _caps(host: dict[str, Any]) -> str:
    dropped = [c.upper().removeprefix("CAP_") for c in host.get("CapDrop") or []]
    added = [c.upper().removeprefix("CAP_") for c in host.get("CapAdd") or []]
    if "ALL" in dropped:
        return "ALL dropped" + (f", {', '.join(added)} added" if added else "")
    if dropped:
        return "Docker's default set minus " + ", ".join(dropped) + (f", plus {', '.join(added)}" if added else "")
    return "Docker's default set" + (f" plus {', '.join(added)}" if added else "")


def _memory(host: dict[str, Any]) -> str:
    mem = host.get("Memory") or 0
    if not mem:
        return "unlimited"
    swap = host.get("MemorySwap") or 0
    text = f"{mem / 2**20:,.0f} MiB"
    if swap == mem:
        text += " (no swap)"
    elif swap == -1:
        text += " + unlimited swap"
    elif swap > mem:
        text += f" + {(swap - mem) / 2**20:,.0f} MiB swap"
    return text


def limits_row(
    attrs: dict[str, Any], image_user: str = "", processes: list[tuple[str, str]] | None = None
) -> dict[str, str]:
    """One row of the limits table from a container's inspect data (``container.attrs``).

    ``image_user`` is the image's USER, which applies when the container sets none;
    ``processes`` are (uid, command) pairs from ``docker top``."""
    host = attrs.get("HostConfig") or {}
    config = attrs.get("Config") or {}
    nano = host.get("NanoCpus") or 0
    quota, period = host.get("CpuQuota") or 0, host.get("CpuPeriod") or 0
    if nano:
        cpus = f"{nano / 1e9:g}"
    elif quota > 0 and period > 0:
        cpus = f"{quota / period:g}"
    else:
        cpus = "unlimited"
    pids = host.get("PidsLimit")
    user = config.get("User") or image_user or ""
    network = str(host.get("NetworkMode") or "default")
    security = [str(s) for s in host.get("SecurityOpt") or []]
    return {
        "network": "bridge (default)" if network == "default" else network,
        "memory": _memory(host),
        "cpus": cpus,
        "pids": str(pids) if pids and pids > 0 else "unlimited",
        "read-only root": "yes" if host.get("ReadonlyRootfs") else "no",
        "code runs as": _code_user(user, processes),
        "capabilities": _caps(host),
        "no-new-privs": "yes" if any(s.startswith("no-new-privileges") for s in security) else "no",
        "runtime": str(host.get("Runtime") or "runc"),
    }


def _cap_eff(pid: str) -> int | None:
    """The effective capability mask of a host process (the container's processes are
    host processes; ``docker top`` gives their host pids)."""
    import re
    from pathlib import Path

    try:
        m = re.search(r"^CapEff:\s+([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1), 16) if m else None


def inspect_limits(container_ids: list[str]) -> list[dict[str, str]]:
    """`limits_row` of each container (the docker SDK, imported here so the module stays light)."""
    import docker

    client = docker.from_env()
    try:
        rows = []
        for cid in container_ids:
            container = client.containers.get(cid)
            attrs = container.attrs
            image_user = (client.images.get(attrs["Image"]).attrs.get("Config") or {}).get("User") or ""
            top = container.top(ps_args="-o pid,uid,comm")  # Docker needs the pid column
            titles = [t.upper() for t in top.get("Titles") or []]
            ip, iu, ic = titles.index("PID"), titles.index("UID"), titles.index("COMMAND")
            procs = top.get("Processes") or []
            processes = [(str(p[iu]), str(p[ic])) for p in procs]
            row = limits_row(attrs, image_user, processes)
            caps = {_cap_eff(str(p[ip])) for p in procs if p[ic] not in WRAPPERS}
            if caps and None not in caps:
                row["capabilities"] += "; the code's process: " + (
                    "none" if caps == {0} else ", ".join(f"CapEff {c:#x}" for c in sorted(caps))
                )
            rows.append(row)
        return rows
    finally:
        client.close()
