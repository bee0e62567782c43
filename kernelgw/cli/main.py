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


# ------------------------------------- server and admin commands, in their modules
from kernelgw.cli.admin import audit, keys  # noqa: E402  (the group must exist first)
from kernelgw.cli.image import image  # noqa: E402
from kernelgw.cli.serve import serve  # noqa: E402

main.add_command(serve)
main.add_command(image)
main.add_command(keys)
main.add_command(audit)


if __name__ == "__main__":
    main()
