"""Package endpoints: install allowlisted packages into a session (offline, from
wheels the gateway resolved on the host), and list the images with what they
have preinstalled. The work is in kernelgw.runtime.packages."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from kernelgw.errors import NotForThisKernel
from kernelgw.kernels import profile
from kernelgw.models import ErrorResponse, ImageInfo, ImageList, InstallRequest, InstallResult
from kernelgw.runtime.packages import PackageInstaller, check_request, image_target
from kernelgw.server.auth import authenticate, session_for
from kernelgw.server.state import gateway_state
from kernelgw.server.v1.files import session_handle

_errors: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 409, 413, 422, 500, 503)
}
router = APIRouter(tags=["packages"], responses=_errors, dependencies=[Depends(authenticate)])


def package_installer(request: Request) -> PackageInstaller:
    """The app's PackageInstaller (made on first use)."""
    return gateway_state(request).package_installer


@router.post("/v1/sessions/{session_id}/packages", response_model=InstallResult)
async def install_packages(session_id: str, body: InstallRequest, request: Request) -> dict[str, Any]:
    """Install allowlisted packages (and their dependencies) into the session; they
    import in the next cell, without a restart. 400: not on the allowlist;
    422: no fitting wheel, or a conflict with what the image has."""
    installer = package_installer(request)
    check_request(body.packages, installer.allowlist)  # 400 before the session is touched
    kernel = session_for(request, session_id).spec.kernel  # a paused session is not resumed for this
    if not profile(kernel).python:
        raise NotForThisKernel(
            f"Packages install into Python sessions only (pip wheels); this session runs {kernel}, "
            "whose image carries its language's libraries."
        )
    session, handle = await session_handle(request, session_id)
    result = await installer.install(handle, session.spec.image, body.packages)
    session.touch()
    await session.keep_files()  # installed packages outlive the kernel too
    return result.model_dump(mode="json")


@router.get("/v1/images", response_model=ImageList, tags=["gateway"])
async def list_images(request: Request) -> dict[str, Any]:
    """The images sessions may use, with their Python version and preinstalled
    packages, and the allowlist of packages sessions may add."""
    state = gateway_state(request)
    settings = state.settings
    backend = state.backend
    images = []
    for name in dict.fromkeys([settings.image, *settings.allowed_images]):
        labels = await backend.image_labels(name)
        target = image_target(labels) if labels is not None else None
        images.append(
            ImageInfo(
                name=name,
                default=name == settings.image,
                present=labels is not None,
                python=target.python if target else None,
                packages=target.packages if target else {},
            )
        )
    return ImageList(images=images, package_allowlist=list(settings.package_allowlist)).model_dump(mode="json")
