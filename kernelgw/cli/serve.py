"""``kernelgw serve``: the checks a start needs before it binds, then the gateway
(one process, or a supervisor and its workers). Imports the server lazily: the
client install has this command too and says what to install."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kernelgw.cli.extras import server_extra
from kernelgw.errors import KernelGWError


@click.command()
@click.option("--host", default=None, help="Address to listen on [env KERNELGW_HOST; 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port [env KERNELGW_PORT; 8000].")
@click.option(
    "--gateway-name",
    default=None,
    help="This gateway's name on this host: its kernels carry it, and one live gateway holds it "
    "[env KERNELGW_GATEWAY_NAME; default].",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Settings file (.json or .toml); KERNELGW_* env vars and options override it.",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "text"]),
    default=None,
    help="Logs on stderr: JSON lines, text, or auto (text on a terminal, else JSON) [env KERNELGW_LOG_FORMAT; auto].",
)
@click.option(
    "--insecure-allow-remote",
    is_flag=True,
    default=False,
    help="Listen beyond loopback without API keys (only behind something that authenticates).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="Gateway processes serving this one port together, each owning its sessions "
    "(about one per core) [env KERNELGW_WORKERS; 1].",
)
def serve(
    host: str | None,
    port: int | None,
    gateway_name: str | None,
    config_file: Path | None,
    log_format: str | None,
    insecure_allow_remote: bool,
    workers: int | None,
) -> None:
    """Run the gateway."""
    import gc

    # Start-up builds many long-lived objects (imports, settings, the app): the
    # cyclic collector's passes over them were 8% of a restart's import time.
    # The server resumes it (frozen) once it listens: `DrainingServer.startup`.
    gc.disable()
    from pydantic import ValidationError

    with server_extra("serve"):
        from kernelgw import logs
        from kernelgw.config import Settings
        from kernelgw.server.app import create_app
        from kernelgw.server.serving import DrainingServer, uvicorn_config

    overrides: dict[str, Any] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if gateway_name is not None:
        overrides["gateway_name"] = gateway_name
    if log_format is not None:
        overrides["log_format"] = log_format
    if insecure_allow_remote:
        overrides["allow_remote_without_auth"] = True
    if workers is not None:
        overrides["workers"] = workers
    try:
        settings = Settings.load(config_file, **overrides)
    except (ValidationError, ValueError) as exc:
        raise click.ClickException(f"invalid settings: {exc}") from exc
    # the gateway's own lines (pool warm-up, orphan clean-up, sessions, refusals)
    logs.configure(settings.log_format)
    _refuse_open_remote(settings)
    _refuse_taken_name(settings)
    _build_missing_kernel_images(settings)
    if settings.workers > 1:
        _serve_workers(settings)
        return
    # its routes are added by the lifespan, beside the store's and Docker's waits
    app = create_app(settings, defer_routes=True)
    # SIGTERM drains (new work refused, running cells finish) before uvicorn exits
    DrainingServer(uvicorn_config(app, settings), app, settings.shutdown_grace_s).run()


def _build_missing_kernel_images(settings: Any) -> None:
    """Build the images of the offered kernels (``kernels``) that the engine lacks,
    with progress, before the gateway takes requests. Python's image is the
    setup's job (`kernelgw image build`); a build that fails leaves that kernel's
    sessions failing with a clear 503, not the gateway down."""
    others = [name for name in settings.kernels if name != "python3"]
    if not others:  # the default: nothing to import (rich, the image builder)
        return
    from rich.console import Console

    from kernelgw.image import build_kernel_image, image_exists

    console = Console(stderr=True)
    for name in others:
        image = settings.kernel_image(name)
        try:
            if image_exists(image):
                continue
            click.echo(f"kernelgw: the image of the {name} kernel ({image}) is missing; building it", err=True)
            build_kernel_image(name, image, python_image=settings.image, console=console)
        except KernelGWError as exc:
            click.echo(f"kernelgw: warning: cannot build the {name} kernel's image: {exc.message}", err=True)


def _refuse_taken_name(settings: Any) -> None:
    """Fail before binding when a live gateway holds this name (or one of its
    workers' names) on this host (the lifespan takes the lock for real; this only
    gives the clear message early)."""
    from kernelgw.errors import GatewayNameInUse
    from kernelgw.runtime.ownership import InstanceLock
    from kernelgw.server.workers import worker_name

    try:
        for i in range(settings.workers):
            InstanceLock(settings.runtime_dir, worker_name(settings.gateway_name, i)).check()
    except GatewayNameInUse as exc:
        raise click.ClickException(exc.message) from exc


def _serve_workers(settings: Any) -> None:
    """``--workers N``: a supervisor and N gateway processes on one port (kernelgw.server.workers)."""
    import gc

    from kernelgw.server.workers import Supervisor

    gc.enable()  # the supervisor serves nothing; each worker's server resumes its own
    try:
        status = Supervisor(settings).run()
    except KernelGWError as exc:
        raise click.ClickException(exc.message) from exc
    except OSError as exc:  # the port is taken, say
        raise click.ClickException(f"cannot listen on {settings.host}:{settings.port}: {exc}") from exc
    raise SystemExit(status)


def _refuse_open_remote(settings: Any) -> None:
    """Fail before binding when no key exists and the address is not loopback.
    On loopback (or when told to allow it) nothing can be refused: the store is
    not opened twice (70-80 ms of a restart); the lifespan logs the warnings."""
    import asyncio

    # not kernelgw.server.auth, which re-exports them: a route module (~30 ms), imported by the lifespan's thread
    from kernelgw.server.authenticator import Authenticator, InsecureBind, is_loopback
    from kernelgw.storage import Store

    if is_loopback(settings.host) or settings.allow_remote_without_auth:
        return

    async def check() -> None:
        store = Store.from_settings(settings)
        await store.start(background=False)
        try:
            await Authenticator(settings, store).check_startup()
        finally:
            await store.close()

    try:
        asyncio.run(check())
    except InsecureBind as exc:
        raise click.ClickException(exc.message) from exc
    except KernelGWError as exc:
        # the gateway starts and answers 503 until its database answers
        click.echo(f"kernelgw: warning: cannot open the gateway's database: {exc.message}", err=True)
