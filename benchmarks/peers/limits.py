"""The limits a peer's container runs under, read from ``docker inspect`` during the run."""

from __future__ import annotations

from typing import Any

COLUMNS = ("network", "memory", "cpus", "pids", "read-only root", "user", "caps dropped", "no-new-privs", "runtime")


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


def limits_row(attrs: dict[str, Any], image_user: str = "") -> dict[str, str]:
    """One row of the limits table from a container's inspect data (``container.attrs``).

    ``image_user`` is the image's USER, which applies when the container sets none."""
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
    caps = host.get("CapDrop") or []
    user = config.get("User") or image_user or ""
    network = str(host.get("NetworkMode") or "default")
    security = [str(s) for s in host.get("SecurityOpt") or []]
    return {
        "network": "bridge (default)" if network == "default" else network,
        "memory": _memory(host),
        "cpus": cpus,
        "pids": str(pids) if pids and pids > 0 else "unlimited",
        "read-only root": "yes" if host.get("ReadonlyRootfs") else "no",
        "user": user if user not in ("", "0", "root", "0:0") else "root",
        "caps dropped": "ALL" if any(c.upper() in ("ALL", "CAP_ALL") for c in caps) else (", ".join(caps) or "none"),
        "no-new-privs": "yes" if any(s.startswith("no-new-privileges") for s in security) else "no",
        "runtime": str(host.get("Runtime") or "runc"),
    }


def inspect_limits(container_ids: list[str]) -> list[dict[str, str]]:
    """`limits_row` of each container (the docker SDK, imported here so the module stays light)."""
    import docker

    client = docker.from_env()
    try:
        rows = []
        for cid in container_ids:
            attrs = client.containers.get(cid).attrs
            image_user = (client.images.get(attrs["Image"]).attrs.get("Config") or {}).get("User") or ""
            rows.append(limits_row(attrs, image_user))
        return rows
    finally:
        client.close()
