"""What a command needs beyond the client install, and the message when it is missing.

``pip install kernelgw`` brings the SDK and the client commands (run, export,
mcp); the gateway's commands (serve, image build, keys, audit) import the server's
dependencies when they run, and say what to install instead of showing a
traceback when those are absent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

SERVER_INSTALL = "pip install 'kernelgw[server]'"


class ServerNotInstalled(click.ClickException):
    """A gateway command ran where only the client is installed."""


@contextlib.contextmanager
def server_extra(command: str) -> Iterator[None]:
    """Turn a missing server dependency, imported inside the block, into a message
    naming what to install. A missing module of kernelgw itself is a bug and is
    not hidden."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] in ("", "kernelgw"):
            raise
        raise ServerNotInstalled(
            f"`kernelgw {command}` needs the gateway's dependencies, which are not installed here "
            f"(no module named {exc.name!r}). Install them with: {SERVER_INSTALL}"
        ) from exc
