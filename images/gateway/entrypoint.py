"""Entry point of the kernelgw gateway container.

``serve`` (the default) checks what a gateway in a container depends on, then
becomes ``kernelgw serve``:

1. The gateway's name: ``KERNELGW_GATEWAY_NAME``, else the host's name (the
   host's ``/etc/hostname`` mounted at ``/etc/host-hostname``), so that a
   restarted or re-created container keeps its name and reattaches its kernels.
2. The Docker engine answers (the mounted socket or ``DOCKER_HOST``).
3. ``KERNELGW_RUNTIME_DIR`` is bind-mounted from the same path on the host: the
   kernel containers bind-mount their socket directories from there, and the
   engine resolves that path on the host, not in this container.
4. The kernel image is present; else it is loaded from ``KERNELGW_IMAGE_ARCHIVE``
   (a ``docker save`` tarball), else built (``kernelgw image build``).
5. ``KERNELGW_ADVERTISE_URL`` (how other gateways reach this one) defaults to
   this container's address.

``healthcheck`` asks the gateway's ``/healthz`` (Docker's HEALTHCHECK); any
other command runs as given (``kernelgw keys create NAME``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HOST_HOSTNAME_FILE = Path("/etc/host-hostname")
DEFAULT_IMAGE = "kernelgw/python:latest"
ENGINE_WAIT_S = 60.0


def say(message: str) -> None:
    """One JSON line on stderr, like the gateway's own logs."""
    record = {"level": "INFO", "logger": "kernelgw.entrypoint", "message": message}
    print(json.dumps(record), file=sys.stderr, flush=True)


def fail(message: str) -> None:
    record = {"level": "ERROR", "logger": "kernelgw.entrypoint", "message": message}
    print(json.dumps(record), file=sys.stderr, flush=True)
    sys.exit(2)


def gateway_name() -> str:
    given = os.environ.get("KERNELGW_GATEWAY_NAME", "")
    if given and "{{" not in given:  # an unrendered Swarm template outside Swarm
        return given
    try:
        raw = HOST_HOSTNAME_FILE.read_text().strip()
    except OSError:
        raw = socket.gethostname()
        say(f"{HOST_HOSTNAME_FILE} is not mounted: the gateway is named after the container ({raw})")
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", raw.split(".")[0])[:40].strip("-.") or "gateway"
    return name


def connect_engine() -> Any:
    import docker
    import docker.errors

    deadline = time.monotonic() + ENGINE_WAIT_S
    while True:
        try:
            client = docker.from_env(timeout=120)
            client.ping()
            return client
        except docker.errors.DockerException as exc:
            if time.monotonic() > deadline:
                where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
                fail(
                    f"The Docker engine at {where} does not answer ({exc}). Mount the host's socket "
                    "(-v /var/run/docker.sock:/var/run/docker.sock) or set DOCKER_HOST."
                )
            time.sleep(1)


def own_container_id() -> str | None:
    """This container's id, from the cgroup (v1) or mount table (v1 and v2)."""
    for source in ("/proc/self/cgroup", "/proc/self/mountinfo"):
        try:
            text = Path(source).read_text()
        except OSError:
            continue
        m = re.search(r"(?:docker[-/]|/containers/)([0-9a-f]{64})", text)
        if m:
            return m.group(1)
    return None


def check_runtime_dir(client: Any, runtime_dir: Path) -> None:
    """The runtime directory must be the host's directory of the same path."""
    import docker.errors

    cid = own_container_id()
    if cid is None:
        say(f"cannot tell which container this is; not checking that {runtime_dir} is the host's own path")
        return
    try:
        mounts = client.api.inspect_container(cid).get("Mounts") or []
    except docker.errors.APIError as exc:
        say(f"cannot inspect this container ({exc}); not checking {runtime_dir}")
        return
    for mount in mounts:
        dest = Path(mount.get("Destination", "/nonexistent"))
        if runtime_dir == dest or dest in runtime_dir.parents:
            expected = Path(mount.get("Source", "")) / runtime_dir.relative_to(dest)
            if mount.get("Type") == "bind" and expected == runtime_dir:
                return
            fail(
                f"KERNELGW_RUNTIME_DIR={runtime_dir} is mounted from {mount.get('Type')} {mount.get('Source') or mount.get('Name')}, "
                f"not from the host's {runtime_dir}. Kernel containers bind-mount their socket directories "
                "from this path and the engine looks it up on the host: mount it at the same path, "
                f"-v {runtime_dir}:{runtime_dir}."
            )
    fail(
        f"KERNELGW_RUNTIME_DIR={runtime_dir} is not a bind mount from the host. Kernel containers "
        f"bind-mount their socket directories from this path on the host: add -v {runtime_dir}:{runtime_dir}."
    )


def ensure_kernel_image(client: Any, image: str) -> None:
    import docker.errors

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    archive = os.environ.get("KERNELGW_IMAGE_ARCHIVE", "")
    if archive and Path(archive).is_file():
        say(f"loading the kernel image {image} from {archive}")
        with open(archive, "rb") as fh:
            client.images.load(fh)
        return
    if os.environ.get("KERNELGW_BUILD_KERNEL_IMAGE", "1") == "0":
        say(
            f"the kernel image {image} is missing and KERNELGW_BUILD_KERNEL_IMAGE=0: /healthz answers 503 until it is loaded"
        )
        return
    say(f"the kernel image {image} is missing; building it (kernelgw image build)")
    done = subprocess.run(["kernelgw", "image", "build", "--tag", image], check=False)
    if done.returncode != 0:
        say(f"building {image} failed; the gateway starts anyway and /healthz answers 503 until the image is there")


def advertise_url(port: str) -> str:
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        address = "127.0.0.1"
    return f"http://{address}:{port}"


def serve(args: list[str]) -> None:
    os.environ["KERNELGW_GATEWAY_NAME"] = gateway_name()
    runtime_dir = Path(os.environ.get("KERNELGW_RUNTIME_DIR", "/run/kernelgw"))
    # the uid lock must be the host's, shared with every gateway there: the
    # container's own file system is read-only and private
    os.environ.setdefault("KERNELGW_UID_STATE_DIR", str(runtime_dir / ".uids"))
    client = connect_engine()
    check_runtime_dir(client, runtime_dir)
    ensure_kernel_image(client, os.environ.get("KERNELGW_IMAGE", DEFAULT_IMAGE))
    client.close()
    port = os.environ.get("KERNELGW_PORT", "8000")
    os.environ.setdefault("KERNELGW_ADVERTISE_URL", advertise_url(port))
    say(
        f"gateway {os.environ['KERNELGW_GATEWAY_NAME']}: runtime directory {runtime_dir}, "
        f"advertised as {os.environ['KERNELGW_ADVERTISE_URL']}"
    )
    os.execvp("kernelgw", ["kernelgw", "serve", *args])


def healthcheck() -> None:
    url = f"http://127.0.0.1:{os.environ.get('KERNELGW_PORT', '8000')}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            sys.exit(0 if response.status == 200 else 1)
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        sys.exit(1)


def main(argv: list[str]) -> None:
    if not argv or argv[0] == "serve":
        serve(argv[1:])
    elif argv[0] == "healthcheck":
        healthcheck()
    else:
        os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
