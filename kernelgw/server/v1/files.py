"""Workspace file endpoints: upload, download, list, delete.

Thin: paths are checked and bytes streamed here, the work is in
kernelgw.runtime.workspace. Uploads are read from the request as it arrives and
downloads are sent as they come out of the container; neither is held whole.

Downloads are served as attachments with ``nosniff`` and a sandboxing CSP:
the files are whatever the session's code wrote, and must never run as a page
of the gateway's origin.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from kernelgw.errors import BadRequest, KernelDied, SessionBusy
from kernelgw.models import ErrorResponse, FileList, UploadResult
from kernelgw.paths import validate_path
from kernelgw.runtime.backends.base import KernelHandle
from kernelgw.runtime.session import KernelSession
from kernelgw.runtime.workspace import WorkspaceFiles
from kernelgw.server.auth import authenticate, session_for
from kernelgw.server.download_response import DownloadResponse
from kernelgw.server.state import gateway_state

_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 404, 409, 413, 503)}
router = APIRouter(tags=["files"], responses=_errors, dependencies=[Depends(authenticate)])


def workspace_files(request: Request) -> WorkspaceFiles:
    """The app's WorkspaceFiles (made on first use)."""
    return gateway_state(request).workspace_files


async def session_handle(request: Request, session_id: str) -> tuple[KernelSession, KernelHandle]:
    """The session and its running container with its files in it (a paused session is
    resumed), or a 404/409."""
    session: KernelSession = session_for(request, session_id)
    if session.state == "closed":
        raise BadRequest("The session is being deleted.")
    handle = await session.files_handle()  # after a resume or restart under way has put the files back
    if handle is None:
        if session.state == "dead":
            raise KernelDied(f"The session's kernel is dead ({session.dead_reason}); restart the session.")
        raise SessionBusy("The session's kernel is (re)starting; try again in a moment.")
    session.touch()
    return session, handle


def quota_bytes(request: Request, session: KernelSession) -> int:
    configured = gateway_state(request).settings.workspace_quota_bytes
    tmpfs = session.spec.workspace_size_mb * 1024 * 1024
    return min(configured, tmpfs) if configured is not None else tmpfs


@router.put(
    "/v1/sessions/{session_id}/files/{path:path}",
    response_model=UploadResult,
    responses={200: {"description": "An existing file was replaced."}, 201: {"description": "Created."}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def upload_file(session_id: str, path: str, request: Request) -> Response:
    """Write the request body to ``path`` in the workspace (parent directories are
    made). Streamed; 413 when the file or the workspace would be over quota, and
    then the workspace is unchanged."""
    rel = validate_path(path)
    length = request.headers.get("content-length")
    try:
        content_length = int(length) if length is not None else None
    except ValueError:
        raise BadRequest("Content-Length is not a number.") from None
    workspace_files(request).check_length(content_length)  # 413 before the body is read
    session, handle = await session_handle(request, session_id)
    try:
        result = await workspace_files(request).upload(
            handle, rel, request.stream(), quota_bytes=quota_bytes(request, session), content_length=content_length
        )
    except ClientDisconnect:
        # nobody reads the answer; the helper saw no commit and discarded the upload
        raise BadRequest("The client disconnected before the upload ended; nothing was written.") from None
    session.touch()
    await session.keep_files()  # the session has a file now: it outlives the kernel
    return JSONResponse(result.model_dump(mode="json"), status_code=201 if result.created else 200)


@router.get("/v1/sessions/{session_id}/files/{path:path}", response_class=StreamingResponse)
async def download_file(session_id: str, path: str, request: Request) -> Response:
    """The file's bytes, streamed, with its MIME type (from the file name)."""
    rel = validate_path(path)
    _, handle = await session_handle(request, session_id)
    download = await workspace_files(request).download(handle, rel)
    name = rel.rsplit("/", 1)[-1]
    headers = {
        "Content-Length": str(download.entry.size),
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}",
        "Last-Modified": download.entry.mtime.strftime("%a, %d %b %Y %H:%M:%S GMT"),
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "Cache-Control": "no-store",
    }
    return DownloadResponse(download, media_type=download.entry.mime_type, headers=headers)


@router.get("/v1/sessions/{session_id}/files", response_model=FileList)
async def list_files(
    session_id: str,
    request: Request,
    path: str = Query("", description="Directory to list, relative to the workspace; '' is the workspace."),
    recursive: bool = Query(False, description="Include the contents of subdirectories (up to 10,000 entries)."),
) -> dict[str, Any]:
    """Entries with type, size and mtime. Symbolic links are listed, never followed."""
    rel = validate_path(path, allow_root=True)
    _, handle = await session_handle(request, session_id)
    listing = await workspace_files(request).list(handle, rel, recursive=recursive)
    return listing.model_dump(mode="json")


@router.delete("/v1/sessions/{session_id}/files/{path:path}", status_code=204)
async def delete_file(session_id: str, path: str, request: Request) -> Response:
    """Remove a file, a directory with its contents, or a symbolic link itself
    (never what it points to)."""
    rel = validate_path(path)
    _, handle = await session_handle(request, session_id)
    await workspace_files(request).delete(handle, rel)
    return Response(status_code=204)
