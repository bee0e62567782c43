"""``kernelgw image``: build the kernel images and the gateway's own image."""

from __future__ import annotations

from typing import Any

import click

from kernelgw.cli.extras import server_extra
from kernelgw.errors import KernelGWError


@click.group()
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
    help="Build the image of this kernel (python3, deno, ir, bash, java, go, cpp, ruby) on the Python one; repeatable. "
    "code-interpreter: one image of python3, deno, bash, java and ir (E2B's code interpreter).",
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
        from kernelgw.image import build_bundle_image, build_image, build_kernel_image
        from kernelgw.kernels import BUNDLES, UnknownKernel, profile

    console = Console(stderr=True)
    if tag and len(kernels) > 1:
        raise click.UsageError("--tag names one image: give one --kernel with it")
    try:
        for name in kernels:
            if name not in BUNDLES:
                profile(name)
    except UnknownKernel as exc:
        raise click.BadParameter(str(exc), param_hint="--kernel") from exc
    results: list[Any] = []  # ImageBuildResult
    try:
        if not kernels:
            results.append(build_image(tag=tag or DEFAULT_IMAGE, base=base, force=force, console=console))
        for name in kernels:
            build = build_bundle_image if name in BUNDLES else build_kernel_image
            results.append(build(name, tag, python_image=python_image or DEFAULT_IMAGE, force=force, console=console))
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
