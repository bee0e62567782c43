"""The Docker engine as the builder uses it: connect, look an image up, pull one."""

from __future__ import annotations

import docker
import docker.errors
from docker.models.images import Image
from rich.console import Console

from kernelgw.errors import EngineUnavailable
from kernelgw.image.names import DEFAULT_TAG
from kernelgw.image.progress import say


def connect() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(
            f"The Docker engine is not answering ({exc}). Start it (scripts/ensure-docker.sh does) and try again."
        ) from exc
    return client


def get_image(client: docker.DockerClient, name: str) -> Image | None:
    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        return None


def id_of(image: Image) -> str:
    """The image's ``sha256:...`` id, which the engine always reports."""
    return str(image.attrs["Id"])


def image_exists(tag: str = DEFAULT_TAG) -> bool:
    """True when the Docker engine has an image called ``tag``."""
    client = connect()
    try:
        return get_image(client, tag) is not None
    finally:
        client.close()


def try_pull(client: docker.DockerClient, name: str, console: Console) -> Image | None:
    repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    say(console, f"pulling {name} ...")
    try:
        return client.images.pull(repo, tag=tag or "latest")
    except docker.errors.APIError as exc:
        reason = str(getattr(exc, "explanation", None) or exc).splitlines()[0][:200]
        say(console, f"[yellow]cannot pull {name}[/]: {reason}")
        return None
