"""The ``kernelgw`` command: run a gateway, build the kernel image, run code.

kernelgw serve [--host H] [--port P] [--config FILE] [--log-format auto|json|text]
               [--insecure-allow-remote]
kernelgw keys create NAME [--admin] [--max-sessions N] ... | keys list | keys revoke ID
kernelgw audit [--since 2h] [--key ID] [--session ID] [--kind K] [--json]
kernelgw image build [--tag T] [--base auto|debootstrap|IMAGE] [--kernel NAME ...] [--force]
kernelgw image build-gateway [--tag T] [--base auto|debootstrap|IMAGE] [--force] [--stand-ins]
kernelgw run [CODE | -] [--server URL] [--session ID] [--timeout S]
             [--save-images DIR | --no-save-images] [--keep] [--upload FILE ...]
             [--save-artifacts DIR]
kernelgw export SESSION [-o OUT.ipynb] [--server URL]
kernelgw mcp [--server URL] [--transport stdio|http] [--host H] [--port P]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import click

from kernelgw.cli.extras import server_extra
from kernelgw.errors import KernelGWError

EXIT_OK = 0
EXIT_ERROR = 1
"""The code raised an exception."""
EXIT_ABORTED = 2
"""The execution timed out, was interrupted, or its kernel died."""
EXIT_GATEWAY = 3
"""The gateway could not be reached or answered with an error."""
EXIT_SIGINT = 130

DEFAULT_IMAGES_DIR = Path("kernelgw-images")
"""Where ``kernelgw run`` saves images by default, relative to where it runs."""


def _use_api_key(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # The SDK clients read KERNELGW_API_KEY when given no key: set it for this process.
    if value:
        import os

        os.environ["KERNELGW_API_KEY"] = value


def server_option(f: Any) -> Any:
    """The gateway a client command talks to (run, export, mcp), and its API key."""
    f = click.option(
        "--api-key",
        envvar="KERNELGW_API_KEY",
        default=None,
        expose_value=False,
        callback=_use_api_key,
        help="API key for a gateway that requires one [env KERNELGW_API_KEY].",
    )(f)
    return click.option(
        "--server",
        envvar="KERNELGW_URL",
        default="http://127.0.0.1:8000",
        show_default=True,
        help="Gateway URL [env KERNELGW_URL].",
    )(f)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """kernelgw: a stateful, sandboxed code interpreter for AI agents."""


# ------------------------------------------------------------------------ serve


@main.command()
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
    app = create_app(settings)
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

    from kernelgw.server.auth import Authenticator, InsecureBind, is_loopback
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


# ------------------------------------------------------------------------ image


@main.group()
def image() -> None:
    """Manage the kernel image."""


def _default_image() -> str | None:
    """The gateway's default image, shown in ``--help``; None on a client-only
    install, where ``image build`` then says what to install."""
    try:
        from kernelgw.config import DEFAULT_IMAGE
    except ModuleNotFoundError:
        return None
    return DEFAULT_IMAGE


@image.command("build")
@click.option(
    "--tag",
    default=None,
    help=f"Image tag to build [default: {_default_image()}, or kernelgw/NAME:latest with --kernel].",
)
@click.option(
    "--base",
    default="auto",
    show_default=True,
    help="Base of the Python image: 'auto', 'debootstrap' (from scratch), or an image to build on.",
)
@click.option(
    "--kernel",
    "kernels",
    multiple=True,
    metavar="NAME",
    help="Build the image of this kernel (python3, deno, ir, bash, java, go, cpp, ruby) on the Python one; repeatable.",
)
@click.option(
    "--python-image",
    default=None,
    help=f"With --kernel: the Python image to build on (built first when missing) [default: {_default_image()}].",
)
@click.option("--force", is_flag=True, help="Rebuild even if the image is up to date.")
def image_build(tag: str | None, base: str, kernels: tuple[str, ...], python_image: str | None, force: bool) -> None:
    """Build the kernel image (the Python one unless --kernel names others)."""
    with server_extra("image build"):
        from rich.console import Console

        from kernelgw.config import DEFAULT_IMAGE
        from kernelgw.image import build_image, build_kernel_image
        from kernelgw.kernels import UnknownKernel, profile

    console = Console(stderr=True)
    if tag and len(kernels) > 1:
        raise click.UsageError("--tag names one image: give one --kernel with it")
    try:
        for name in kernels:
            profile(name)
    except UnknownKernel as exc:
        raise click.BadParameter(str(exc), param_hint="--kernel") from exc
    results: list[Any] = []  # ImageBuildResult
    try:
        if not kernels:
            results.append(build_image(tag=tag or DEFAULT_IMAGE, base=base, force=force, console=console))
        for name in kernels:
            results.append(
                build_kernel_image(name, tag, python_image=python_image or DEFAULT_IMAGE, force=force, console=console)
            )
    except KernelGWError as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_builds(results)


def _echo_builds(results: list[Any]) -> None:
    """One line per image (ImageBuildResult): built, or already up to date."""
    for result in results:
        if result.built:
            click.echo(f"built {result.tag} ({result.image_id}) in {result.seconds:.1f}s")
        else:
            click.echo(f"{result.tag} is up to date ({result.image_id}); --force rebuilds it")


@image.command("build-gateway")
@click.option("--tag", default="kernelgw/gateway:latest", show_default=True, help="Image tag to build.")
@click.option(
    "--base",
    default="auto",
    show_default=True,
    help="Base image: 'auto', 'debootstrap' (from scratch), or an image to build on.",
)
@click.option("--force", is_flag=True, help="Rebuild even if the image is up to date.")
@click.option(
    "--stand-ins",
    is_flag=True,
    help="Also build kernelgw/postgres:15 and kernelgw/haproxy:2.6 from Debian packages, "
    "for compose.yaml where no registry can be reached.",
)
def image_build_gateway(tag: str, base: str, force: bool, stand_ins: bool) -> None:
    """Build the gateway's container image (images/gateway; from a source checkout)."""
    with server_extra("image build-gateway"):
        from rich.console import Console

        from kernelgw.image.gateway import build_gateway_image, source_root
        from kernelgw.image.standins import build_standins

    console = Console(stderr=True)
    try:
        results = [build_gateway_image(tag=tag, base=base, force=force, console=console)]
        if stand_ins:
            results += build_standins(source_root(), force=force, console=console)
    except KernelGWError as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_builds(results)


# -------------------------------------------------------------------------- run


@dataclass
class _Printer:
    """Writes a streamed execution's events to the terminal as they arrive.

    PNG images go to files in ``save_dir`` (created with the first one), never
    over an existing file; a terminal cannot show them, and a chart's text/plain
    (``<Figure ...>``) says nothing.
    """

    save_dir: Path | None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    images_saved: int = 0

    def event(self, event: Any) -> None:
        kind = event.type
        if kind == "stream":
            stream = self.out if event.name == "stdout" else self.err
            stream.write(event.text)
            stream.flush()
        elif kind in ("display", "update_display", "result"):
            self._bundle(event.execution_id or "output", event.data)
        elif kind == "error":
            self.err.write("\n".join(event.traceback_text) + "\n")
            self.err.flush()
        elif kind == "truncated":
            self.err.write(f"[{event.message}]\n")
            self.err.flush()

    def _bundle(self, execution_id: str, data: dict[str, Any]) -> None:
        png = data.get("image/png")
        path = self._save_png(execution_id, png) if png is not None and self.save_dir is not None else None
        if path is not None:
            self.out.write(f"[image saved: {path}]\n")
        else:
            text = data.get("text/plain")
            if text is not None:
                self.out.write((text if isinstance(text, str) else "".join(text)) + "\n")
            elif png is not None:
                self.out.write("[image/png; use --save-images DIR to keep it]\n")
        self.out.flush()

    def _save_png(self, execution_id: str, png: Any) -> Path | None:
        """Write the image to a new file; None (and a note on stderr) when that fails."""
        import base64
        import binascii

        assert self.save_dir is not None
        self.images_saved += 1
        try:
            content = base64.b64decode(png if isinstance(png, str) else "".join(png))
            self.save_dir.mkdir(parents=True, exist_ok=True)
            return _write_new(self.save_dir, f"{execution_id}-{self.images_saved}", ".png", content)
        except (OSError, binascii.Error, TypeError) as exc:
            self.err.write(f"[image not saved: {exc}]\n")
            self.err.flush()
            return None


def _write_new(directory: Path, stem: str, suffix: str, content: bytes) -> Path:
    """Write ``content`` to ``stem + suffix`` in ``directory``, or to ``stem-2 + suffix``
    and so on when that exists: an earlier run's file is never replaced."""
    n = 1
    while True:
        path = directory / (f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")
        try:
            with path.open("xb") as fh:
                fh.write(content)
            return path
        except FileExistsError:
            n += 1


def _read_code(code: str | None) -> str:
    if code is None or code == "-":
        return sys.stdin.read()
    return code


@main.command()
@click.argument("code", required=False)
@server_option
@click.option("--session", "session_id", default=None, help="Run in this existing session.")
@click.option(
    "--kernel",
    default=None,
    metavar="NAME",
    help="New sessions' kernel (language): python3, deno, ir, bash, java, go, cpp, ruby [default: the gateway's first].",
)
@click.option("--timeout", type=float, default=None, help="Execution timeout in seconds.")
@click.option(
    "--save-images",
    "save_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Save PNG images as DIR/<execution_id>-<n>.png [default: ./{DEFAULT_IMAGES_DIR}].",
)
@click.option(
    "--no-save-images",
    is_flag=True,
    help="Do not save images; print their text form (e.g. <Figure ...>) instead.",
)
@click.option("--keep", is_flag=True, help="Keep the new session and print its id.")
@click.option(
    "--upload",
    "uploads",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Upload FILE into the workspace (under its name) before running; repeatable.",
)
@click.option(
    "--save-artifacts",
    "artifacts_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Download the files the code created or changed in the workspace into DIR.",
)
def run(
    code: str | None,
    server: str,
    session_id: str | None,
    kernel: str | None,
    timeout: float | None,
    save_dir: Path | None,
    no_save_images: bool,
    keep: bool,
    uploads: tuple[Path, ...],
    artifacts_dir: Path | None,
) -> None:
    """Run code in a session and stream its output.

    CODE is source in the session's language (Python unless --kernel says
    otherwise); with '-' or no CODE it is read from stdin. Without
    --session a new session is created, and deleted afterwards unless --keep.
    Images (charts) are saved in ./kernelgw-images (made when the first one
    arrives; existing files are never replaced) and their paths printed.
    Files the code creates or changes in the workspace are listed on stderr.

    Exit status: 0 ok, 1 the code raised, 2 timeout / interrupted / kernel died,
    3 the gateway failed or could not be reached.
    """
    import httpx

    from kernelgw.client import Client

    if no_save_images and save_dir is not None:
        raise click.UsageError("--save-images and --no-save-images contradict each other")
    source = _read_code(code)
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
    printer = _Printer(None if no_save_images else save_dir or DEFAULT_IMAGES_DIR)
    status: str | None = None
    reason: str | None = None

    try:
        client = Client(server)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server") from exc
    with client:
        session = None
        try:
            if session_id is not None:
                session = client.get_session(session_id)
            else:
                session = client.create_session(kernel=kernel)
            for local in uploads:
                session.upload(local)
            artifacts: list[Any] = []
            try:
                for event in session.stream(source, timeout=timeout):
                    if event.type == "done":
                        status, reason = event.status, event.reason
                        if event.state_lost:
                            reason = (reason + "; " if reason else "") + "kernel state was lost"
                        artifacts = list(event.artifacts)
                    else:
                        printer.event(event)
            except KeyboardInterrupt:
                session.interrupt()
                click.echo("\ninterrupted", err=True)
                sys.exit(EXIT_SIGINT)
            _artifacts(session, artifacts, artifacts_dir)
        except (KernelGWError, httpx.HTTPError, OSError) as exc:
            click.echo(f"kernelgw: {_describe(exc, server)}", err=True)
            sys.exit(EXIT_GATEWAY)
        finally:
            if session is not None and session_id is None:
                if keep:
                    click.echo(f"session: {session.id}", err=True)
                else:
                    _quiet_delete(session)

    if status == "ok":
        sys.exit(EXIT_OK)
    if status == "error":
        sys.exit(EXIT_ERROR)
    click.echo(f"kernelgw: execution {status}" + (f": {reason}" if reason else ""), err=True)
    sys.exit(EXIT_ABORTED)


def _artifacts(session: Any, artifacts: list[Any], save_dir: Path | None) -> None:
    """List the files the code wrote; with ``save_dir``, download them there."""
    from kernelgw.paths import validate_path

    for artifact in artifacts:
        where = ""
        if save_dir is not None:
            try:
                rel = validate_path(artifact.path)  # the kernel reported it: never trust it
            except KernelGWError:
                click.echo(f"[artifact with an unsafe path skipped: {artifact.path!r}]", err=True)
                continue
            target = save_dir.joinpath(*rel.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            session.download(rel, target)
            where = f" -> {target}"
        click.echo(
            f"[{artifact.change}: {artifact.path} ({artifact.size} bytes, {artifact.mime_type}){where}]", err=True
        )


def _describe(exc: BaseException, server: str) -> str:
    import httpx

    if isinstance(exc, (httpx.ConnectError, ConnectionRefusedError)):
        return f"cannot reach the gateway at {server} ({exc}); is `kernelgw serve` running?"
    return str(exc) or type(exc).__name__


def _quiet_delete(session: Any) -> None:
    try:
        session.delete(missing_ok=True)
    except Exception as exc:
        click.echo(f"kernelgw: could not delete session {session.id}: {exc}", err=True)


# ----------------------------------------------------------------------- export


@main.command()
@click.argument("session_id", metavar="SESSION")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the notebook here (default: stdout).",
)
@server_option
def export(session_id: str, output: Path | None, server: str) -> None:
    """Export a session (live, or deleted while its history is kept) as a notebook.

    One code cell per execution with its outputs, notes as markdown cells.
    """
    import json

    import httpx

    from kernelgw.client import Client

    try:
        client = Client(server)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server") from exc
    with client:
        try:
            notebook = client.export_notebook(session_id, output)
        except (KernelGWError, httpx.HTTPError, OSError) as exc:
            click.echo(f"kernelgw: {_describe(exc, server)}", err=True)
            sys.exit(EXIT_GATEWAY)
    if output is None:
        click.echo(json.dumps(notebook, indent=1, ensure_ascii=False))
    else:
        cells = notebook.get("cells", [])
        code = sum(1 for c in cells if c.get("cell_type") == "code")
        click.echo(f"wrote {output} ({code} code cells, {len(cells) - code} notes)", err=True)


# -------------------------------------------------------------------------- mcp


@main.command("mcp")
@server_option
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio (one client) or streamable HTTP.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address to listen on.")
@click.option("--port", type=int, default=8100, show_default=True, help="HTTP: port.")
@click.option("--path", "mcp_path", default="/mcp", show_default=True, help="HTTP: endpoint path.")
@click.option("--timeout", type=float, default=None, help="Default execution timeout in seconds.")
@click.option("--memory-mb", type=int, default=None, help="Memory limit of each sandbox.")
@click.option(
    "--kernel",
    default=None,
    metavar="NAME",
    help="Sandboxes' kernel; names the code tool (run_python, run_ruby, ...) (language): python3, deno, ir, bash, java, go, cpp, ruby [default: the gateway's first].",
)
@click.option(
    "--idle-timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="HTTP: delete a sandbox addressed by sandbox_id after this many idle seconds.",
)
def mcp_command(
    server: str,
    transport: str,
    host: str,
    port: int,
    mcp_path: str,
    timeout: float | None,
    memory_mb: int | None,
    kernel: str | None,
    idle_timeout: float,
) -> None:
    """Serve kernelgw sandboxes to MCP clients (needs: pip install 'kernelgw[mcp]').

    Tools: run_python, upload_file, download_file, list_files, export_notebook,
    reset_session. Each MCP client session gets its own sandbox, deleted when
    the session ends.
    """
    import logging

    try:
        from kernelgw.integrations import mcp as mcp_server
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc
    from kernelgw.client._base import _normalize_base_url

    try:
        _normalize_base_url(server)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server") from exc
    # stdout belongs to the protocol on stdio: log to stderr only
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    options: dict[str, Any] = {"idle_timeout": idle_timeout, "exec_timeout": timeout, "kernel": kernel}
    if memory_mb is not None:
        options["session_options"] = {"memory_mb": memory_mb}
    if transport == "stdio":
        mcp_server.run_stdio(server, **options)
    else:
        mcp_server.run_http(server, host=host, port=port, path=mcp_path, **options)


# ------------------------------------------------------------------------ admin
from kernelgw.cli.admin import audit, keys  # noqa: E402  (the group must exist first)

main.add_command(keys)
main.add_command(audit)


if __name__ == "__main__":
    main()
