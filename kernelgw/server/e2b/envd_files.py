"""envd's file transfers on a sandbox's workspace: ``GET /files`` and ``POST /files``.

A download (``sandbox.files.read``) is the file's bytes as they come out of
the container (`WorkspaceFiles.download`), gzip-compressed when the client
asks (``Accept-Encoding: gzip``). An upload (``sandbox.files.write``,
``write_files``) is a ``multipart/form-data`` body with one ``file`` part per
file, named by the ``path`` query parameter (one file) or by each part's file
name, or a raw ``application/octet-stream`` body for ``path``; either may be
sent with ``Content-Encoding: gzip``. Each file streams into the workspace
(`WorkspaceFiles.upload`): parts are parsed as they arrive, and neither
direction holds more than about a megabyte of a file in the gateway. The
answer is envd's: a list of ``{"name", "type", "path"}``. E2B's file metadata
(``X-Metadata-<key>`` headers, envd 0.6.2) is kept on every file of the upload
as envd keeps it, ``user.e2b.<key>`` extended attributes (keys lowercased),
which entries then carry as ``metadata``.

Paths, the one user and the path rules are those of `kernelgw.server.e2b.envd`.
Errors are envd's: ``{"code": <status>, "message": ...}``; a file over the
workspace quota or the per-file limit is a 507 (the SDK's
`NotEnoughSpaceException`), and a file refused leaves the workspace as it was
(files of the same upload written before it stay, as on envd).
"""

from __future__ import annotations

import re
import zlib
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import anyio
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from kernelgw.errors import BadRequest, Forbidden, InvalidPath, KernelGWError, PayloadTooLarge
from kernelgw.server.download_response import DownloadResponse
from kernelgw.server.e2b import errors as e2b_errors
from kernelgw.server.e2b.envd import check_user, sandbox_path, workspace_files, workspace_of, workspace_path
from kernelgw.server.e2b.errors import e2b_response
from kernelgw.server.e2b.sandbox import ENVD_PORT, sandbox_for
from kernelgw.server.face_routes import face_route
from kernelgw.server.state import gateway_state

INSUFFICIENT_STORAGE = 507
"""envd's status for a full disk (the SDK's `NotEnoughSpaceException`)."""
MAX_FILES = 1000
"""Files in one upload at most."""
INFLATE_PIECE = 1 << 20
"""A gzip body is inflated at most this much at a time (a small body may inflate to a lot)."""
THREAD_BYTES = 64 * 1024
"""Larger pieces are (de)compressed in a worker thread, off the event loop."""
PATH_QUERY = Query(None, description="The file, as the sandbox sees it (/home/user/...).")
USER_QUERY = Query(None, description="The sandbox's user (only 'user').")


def files_shape(request: Request, exc: Exception) -> Response | None:
    """envd's answer to an error: kernelgw's errors with envd's statuses."""
    if isinstance(exc, KernelGWError):
        status = exc.status_code
        if isinstance(exc, PayloadTooLarge):
            status = INSUFFICIENT_STORAGE
        elif isinstance(exc, Forbidden):
            status = 403
        return e2b_response(status, exc.message, error_code=exc.code, headers=e2b_errors.error_headers(exc))
    return e2b_errors.to_response(request, exc)


FilesRoute = face_route(files_shape, "FilesRoute")
router = APIRouter(route_class=FilesRoute, tags=["e2b"])


def file_path(path: str | None) -> str:
    """The workspace path of a file to read or write; the workspace itself is a directory."""
    if not path:
        raise BadRequest("The path query parameter is required: the file, e.g. /home/user/data.csv.")
    rel = workspace_path(path)
    if rel == "":
        raise InvalidPath(f"{path!r} is a directory (the sandbox's workspace); name a file in it.")
    return rel


# ---------------------------------------------------------------- download


@router.get("/e2b/files")
async def download_file(request: Request, path: str | None = PATH_QUERY, username: str | None = USER_QUERY) -> Response:
    """The file's bytes (gzip when asked for), with its MIME type from its name."""
    sandbox = await sandbox_for(request, ENVD_PORT)
    check_user(username)
    rel = file_path(path)
    download = await workspace_files(request).download(await workspace_of(request, sandbox), rel)
    name = rel.rsplit("/", 1)[-1]
    headers = {
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}",
        "Last-Modified": download.entry.mtime.strftime("%a, %d %b %Y %H:%M:%S GMT"),
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "Cache-Control": "no-store",
        "Vary": "Accept-Encoding",
    }
    body: AsyncIterator[bytes] = download.chunks
    if accepts_gzip(request.headers.get("accept-encoding", "")):
        headers["Content-Encoding"] = "gzip"
        body = gzipped(download.chunks)
    else:
        headers["Content-Length"] = str(download.entry.size)
    return DownloadResponse(download, body, media_type=download.entry.mime_type, headers=headers)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether ``Accept-Encoding`` takes gzip (a ``q=0`` refuses it)."""
    for item in accept_encoding.split(","):
        name, _, params = item.strip().partition(";")
        if name.strip().lower() not in ("gzip", "x-gzip"):
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


async def gzipped(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` as one gzip stream."""
    deflater = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    async for chunk in chunks:
        if len(chunk) > THREAD_BYTES:
            out = await anyio.to_thread.run_sync(deflater.compress, chunk)
        else:
            out = deflater.compress(chunk)
        if out:
            yield out
    yield deflater.flush()


# ---------------------------------------------------------------- upload


@router.post("/e2b/files")
async def upload_files(request: Request, path: str | None = PATH_QUERY, username: str | None = USER_QUERY) -> Response:
    """Write one file (a raw body) or several (multipart) into the workspace."""
    sandbox = await sandbox_for(request, ENVD_PORT)
    check_user(username)
    metadata = upload_metadata(request.headers.items())
    media, options = parse_options_header(request.headers.get("content-type", ""))
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip"):
        raise BadRequest(f"Content-Encoding {encoding} is not taken: send gzip or identity.")
    body: AsyncIterator[bytes] = request.stream()
    if encoding == "gzip":
        body = gunzipped(body)
    state = gateway_state(request)
    files = state.workspace_files
    session = sandbox.session
    quota = quota_bytes(state.settings.workspace_quota_bytes, session.spec.workspace_size_mb)
    written: list[str] = []
    try:
        if media == b"application/octet-stream":
            rel = file_path(path)
            length = request.headers.get("content-length")
            declared = int(length) if encoding != "gzip" and length and length.isdigit() else None
            files.check_length(declared)
            await files.upload(
                await workspace_of(request, sandbox),
                rel,
                body,
                quota_bytes=quota,
                content_length=declared,
                metadata=metadata,
            )
            written.append(rel)
        elif media.startswith(b"multipart/"):
            boundary = options.get(b"boundary")
            if not boundary:
                raise BadRequest("The multipart body has no boundary in its Content-Type.")
            handle = await workspace_of(request, sandbox)
            async for part in multipart_parts(body, boundary):
                if part.name != "file":
                    await drain(part.data)  # envd reads only the "file" parts
                    continue
                rel = file_path(path if path is not None else part.filename)
                if rel in written:
                    raise BadRequest(
                        f"{sandbox_path(rel)} is named twice in one upload: each file goes to a path of its own "
                        f"(written before it: {', '.join(sandbox_path(w) for w in written)})."
                    )
                if len(written) >= MAX_FILES:
                    raise BadRequest(f"An upload takes at most {MAX_FILES} files; send the rest in another.")
                await files.upload(handle, rel, part.data, quota_bytes=quota, metadata=metadata)
                written.append(rel)
        else:
            shown = media.decode("latin-1") or "(none)"
            raise BadRequest(
                f"Content-Type {shown} is not taken: send multipart/form-data or application/octet-stream."
            )
    except ClientDisconnect:
        raise BadRequest(
            "The client disconnected before the upload ended; the file it was sending was not written."
        ) from None
    finally:
        if written:
            session.touch()
            await session.keep_files()  # the sandbox has files now: they outlive its kernel
    return JSONResponse([write_info(rel, metadata) for rel in written])


def write_info(rel: str, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """envd's ``EntryInfo`` of a written file (with the metadata it keeps, if any)."""
    info: dict[str, Any] = {"name": rel.rsplit("/", 1)[-1], "type": "file", "path": sandbox_path(rel)}
    if metadata:
        info["metadata"] = metadata
    return info


METADATA_HEADER = "x-metadata-"
"""E2B's file metadata comes as ``X-Metadata-<key>: <value>`` headers on an upload."""
METADATA_KEY = re.compile(r"[A-Za-z0-9!#$%&'*+\-.^_`|~]+")
MAX_METADATA_KEY = 255 - len("user.e2b.")
"""The kernel's limit on an extended attribute's name, less envd's prefix."""
MAX_METADATA_VALUE = 1024
MAX_METADATA_BYTES = 4096
"""All of one file's metadata (keys and values): what any file system keeps on one inode."""


def upload_metadata(headers: Iterable[tuple[str, str]]) -> dict[str, str] | None:
    """E2B's metadata of an upload (keys lowercased, as envd keeps them), every
    file of it gets; None when there is none. Keys and values envd refuses are a
    `BadRequest` naming them."""
    metadata: dict[str, str] = {}
    for name, value in headers:
        if not name.lower().startswith(METADATA_HEADER):
            continue
        key = name[len(METADATA_HEADER) :].lower()
        if not METADATA_KEY.fullmatch(key) or len(key) > MAX_METADATA_KEY:
            raise BadRequest(
                f"Metadata key {key[:80]!r} is not taken: 1 to {MAX_METADATA_KEY} characters of letters, digits "
                "and !#$%&'*+-.^_`|~."
            )
        if len(value) > MAX_METADATA_VALUE or not all(" " <= c <= "~" for c in value):
            raise BadRequest(
                f"Metadata value of {key!r} is not taken: at most {MAX_METADATA_VALUE} printable ASCII characters."
            )
        metadata[key] = value
    if sum(len(k) + len(v) for k, v in metadata.items()) > MAX_METADATA_BYTES:
        raise BadRequest(f"The upload's metadata is larger than {MAX_METADATA_BYTES} bytes (keys and values).")
    return metadata or None


def quota_bytes(configured: int | None, workspace_size_mb: int) -> int:
    """The workspace quota, as ``/v1`` counts it: the setting, at most the tmpfs."""
    tmpfs = workspace_size_mb * 1024 * 1024
    return min(configured, tmpfs) if configured is not None else tmpfs


async def gunzipped(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """A gzip body inflated as it arrives, at most `INFLATE_PIECE` at a time."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def inflate(data: bytes) -> bytes:
        try:
            return inflater.decompress(data, INFLATE_PIECE)
        except zlib.error as exc:
            raise BadRequest(f"The gzip-encoded body is not valid gzip: {exc}.") from None

    async for chunk in chunks:
        data = chunk
        while data:
            if len(data) > THREAD_BYTES:
                out = await anyio.to_thread.run_sync(inflate, data)
            else:
                out = inflate(data)
            if out:
                yield out
            data = inflater.unconsumed_tail
    if not inflater.eof:
        raise BadRequest("The gzip-encoded body ended before its gzip stream did.")


async def drain(chunks: AsyncIterable[bytes]) -> None:
    async for _ in chunks:
        pass


# ---------------------------------------------------------------- multipart


@dataclass
class Part:
    """One part of a multipart body: its form name, file name, and data as it arrives."""

    name: str
    filename: str | None
    data: AsyncIterator[bytes]


async def multipart_parts(body: AsyncIterable[bytes], boundary: bytes) -> AsyncIterator[Part]:
    """The parts of a multipart body, parsed as it arrives. Each part's data must
    be read (or left) before the next part comes; a body that ends inside a part,
    or without its closing boundary, is a `BadRequest`."""
    events: deque[tuple[str, Any]] = deque()
    header: list[bytes] = [b"", b""]
    headers: dict[bytes, bytes] = {}

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        headers[header[0].strip().lower()] = header[1].strip()
        header[0] = header[1] = b""

    def on_headers_finished() -> None:
        events.append(("part", dict(headers)))
        headers.clear()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        events.append(("data", bytes(data[start:end])))

    parser = MultipartParser(
        boundary,
        {
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": lambda: events.append(("end", None)),
            "on_end": lambda: events.append(("done", None)),
        },
    )
    chunks = aiter(body)

    async def next_event() -> tuple[str, Any]:
        while not events:
            chunk = await anext(chunks, None)
            if chunk is None:
                return ("eof", None)
            try:
                parser.write(chunk)
            except Exception as exc:  # python-multipart's MultipartParseError and kin
                raise BadRequest(f"The multipart body is malformed: {exc}.") from None
        return events.popleft()

    async def part_data() -> AsyncIterator[bytes]:
        while True:
            kind, value = await next_event()
            if kind == "data":
                if value:
                    yield value
            elif kind == "end":
                return
            else:
                raise BadRequest("The multipart body ended inside a part; the part was not written.")

    while True:
        kind, value = await next_event()
        if kind == "done":
            return
        if kind == "eof":
            raise BadRequest("The multipart body ended without its closing boundary.")
        if kind != "part":
            continue
        _, params = parse_options_header(value.get(b"content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        filename = params.get(b"filename")
        data = part_data()
        yield Part(name, form_file_name(filename) if filename is not None else None, data)
        await drain(data)  # what the consumer left of it


def form_file_name(raw: bytes) -> str:
    """A part's file name as the SDK wrote it: httpx escapes ``"`` as ``%22`` (HTML5's form encoding)."""
    return raw.decode("utf-8", "surrogateescape").replace("%22", '"')
