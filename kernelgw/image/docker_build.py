"""``docker build --network none`` of a prepared context, shown as it goes.

The Docker API streams the legacy builder's log; its ``Step n/m`` lines become
a progress display, the last lines are kept for the error when it fails, and
untagged leftovers of earlier builds are removed afterwards.
"""

from __future__ import annotations

import contextlib
import re
from collections import deque
from pathlib import Path

import docker
import docker.errors
from rich.console import Console

from kernelgw.image.engine import get_image, id_of
from kernelgw.image.errors import LOG_TAIL_LINES, ImageBuildError
from kernelgw.image.names import STAGE_LABEL
from kernelgw.image.progress import spinner

_BUILD_TIMEOUT = 3600  # seconds the Docker API may stay silent during a build


def parse_step(line: str) -> str | None:
    """``"Step 3/12 : RUN ..."`` from a legacy-builder log line, else None."""
    m = re.match(r"\s*(Step \d+/\d+ : .*)", line)
    return m.group(1).strip() if m else None


def stream_build(
    client: docker.DockerClient,
    context: Path,
    *,
    tag: str,
    buildargs: dict[str, str],
    labels: dict[str, str],
    console: Console,
) -> tuple[str, set[str]]:
    """Run the build, showing progress; returns (image id, layer ids seen)."""
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    seen_ids: set[str] = set()
    image_id: str | None = None
    error: str | None = None
    progress = spinner(console)
    with progress:
        task = progress.add_task(f"docker build {tag}", total=None)
        try:
            stream = client.api.build(
                path=str(context),
                tag=tag,
                buildargs=buildargs,
                labels=labels,
                network_mode="none",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                timeout=_BUILD_TIMEOUT,
            )
            for chunk in stream:
                if "error" in chunk or "errorDetail" in chunk:
                    error = chunk.get("error") or chunk["errorDetail"].get("message", str(chunk))
                    tail.append(error)
                    continue
                aux = chunk.get("aux")
                if isinstance(aux, dict) and aux.get("ID"):
                    image_id = aux["ID"]
                text = chunk.get("stream")
                if not text:
                    continue
                for line in text.splitlines():
                    if not line.strip():
                        continue
                    tail.append(line)
                    step = parse_step(line)
                    if step:
                        short = step if len(step) <= 100 else step[:97] + "..."
                        progress.update(task, description=short)
                        console.print(f"[dim]{short}[/]", highlight=False, no_wrap=True, overflow="ellipsis")
                    m = re.match(r"\s*(?:--->|Successfully built)\s+([0-9a-f]{12,64})\s*$", line)
                    if m:
                        seen_ids.add(m.group(1))
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker build of {tag} failed: {exc}", "\n".join(tail)) from exc
    if error:
        raise ImageBuildError(f"docker build of {tag} failed: {error.strip()}", "\n".join(tail))
    if image_id is None:
        image = get_image(client, tag)
        if image is None:
            raise ImageBuildError(f"docker build of {tag} produced no image", "\n".join(tail))
        image_id = id_of(image)
    return image_id, seen_ids


def cleanup_after_build(client: docker.DockerClient, new_id: str, seen_ids: set[str]) -> None:
    """Remove leftovers of earlier builds: untagged first-stage images and
    untagged kernel images (what ``tag`` pointed at before). Images still
    used by a container, and this build's own layers (its cache), stay."""
    stale: set[str] = set()
    for label in (f"{STAGE_LABEL}=build", "kernelgw.image=python"):
        try:
            found = client.images.list(filters={"dangling": True, "label": label})
        except docker.errors.APIError:
            continue
        for img in found:
            found_id = id_of(img)
            short = found_id.split(":", 1)[-1]
            if found_id != new_id and not any(short.startswith(s) for s in seen_ids):
                stale.add(found_id)
    for image_id in stale:
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image_id)
