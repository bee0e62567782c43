"""Connect RPC, the part E2B's SDK speaks to envd: unary calls with the JSON codec.

A call is ``POST /<package>.<Service>/<Method>`` with ``Content-Type:
application/json`` and the request message as proto3 JSON; the answer is the
response message as JSON (200), or an error: ``{"code": "not_found",
"message": "..."}`` with the HTTP status the Connect protocol gives that code.
Optional request headers: ``Connect-Timeout-Ms`` (the call's deadline: past it
the answer is ``deadline_exceeded``) and ``Content-Encoding: gzip``.

A server-streaming call (``Content-Type: application/connect+json``) takes
its request message in one envelope (a flags byte, a 4-byte big-endian length,
the JSON) and answers with status 200 and enveloped messages, ended by an
end-of-stream envelope (flags 0x02) that is ``{}`` or carries the call's error.
A client-streaming call sends its messages enveloped the same way, one after
the other in the request body (``client_stream`` reads each as it comes), and
gets one message and the end-of-stream envelope back.

Hand-written on purpose: the `connectrpc` package would want generated server
stubs and protobuf runtime classes for a few unary JSON calls whose whole
protocol is this module.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Literal, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel, ValidationError

Code = Literal[
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
]

HTTP_STATUS: dict[str, int] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""The Connect protocol's HTTP status for each code."""

STREAM_CONTENT_TYPE = "application/connect+json"
MAX_REQUEST_BYTES = 1 << 20
"""The largest request message taken (envd's are a path or two)."""

M = TypeVar("M", bound=BaseModel)


class ConnectError(Exception):
    """An error a Connect call answers with."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def response(self, request: Request | None = None) -> Response:
        """The unary answer, or for a streaming call its end-of-stream envelope."""
        error = {"code": self.code, "message": self.message}
        if request is not None and is_streaming(request):
            return Response(end_envelope(self), status_code=200, media_type=STREAM_CONTENT_TYPE)
        return Response(json.dumps(error), status_code=HTTP_STATUS[self.code], media_type="application/json")


def is_streaming(request: Request) -> bool:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower().startswith("application/connect+")


async def read_message(request: Request, model: type[M]) -> M:
    """The request message of a unary JSON call, as ``model``; an invalid one is
    ``invalid_argument``, another codec ``unimplemented``."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ConnectError(
            "unimplemented",
            f"Content-Type {media or '(none)'} is not served: kernelgw's envd takes unary calls with the JSON codec "
            "(application/json), as E2B's SDKs send them",
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_REQUEST_BYTES:
            raise ConnectError("resource_exhausted", f"The request message is larger than {MAX_REQUEST_BYTES} bytes")
    data = bytes(body)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "gzip":
        data = _gunzip(data)
    elif encoding not in ("", "identity"):
        raise ConnectError("unimplemented", f"Content-Encoding {encoding} is not served (gzip and identity are)")
    return parse_message(data, model)


def envelope(message: BaseModel | dict[str, Any]) -> bytes:
    """One message of a streaming answer, as proto3 JSON in its envelope."""
    if isinstance(message, BaseModel):
        data = message.model_dump_json(by_alias=True, exclude_none=True).encode()
    else:
        data = json.dumps(message, separators=(",", ":")).encode()
    return b"\x00" + len(data).to_bytes(4, "big") + data


def end_envelope(error: ConnectError | None = None) -> bytes:
    """The end of a streaming answer: ``{}``, or the error it ends with."""
    data = json.dumps({"error": {"code": error.code, "message": error.message}} if error else {}).encode()
    return b"\x02" + len(data).to_bytes(4, "big") + data


async def read_stream_message(request: Request, model: type[M]) -> M:
    """The one request message of a server-streaming call (enveloped JSON), as ``model``."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != STREAM_CONTENT_TYPE:
        raise ConnectError(
            "unimplemented",
            f"Content-Type {media or '(none)'} is not served for a streaming call: kernelgw's envd takes "
            f"{STREAM_CONTENT_TYPE}, as E2B's SDKs send it",
        )
    encoding = request.headers.get("connect-content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ConnectError("unimplemented", f"Connect-Content-Encoding {encoding} is not served (identity is)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_REQUEST_BYTES + 5:
            raise ConnectError("resource_exhausted", f"The request message is larger than {MAX_REQUEST_BYTES} bytes")
    if len(body) < 5:
        raise ConnectError("invalid_argument", "The request has no enveloped message")
    flags, size = body[0], int.from_bytes(body[1:5], "big")
    if flags & 0x01:
        raise ConnectError("unimplemented", "A compressed request message is not served")
    if size != len(body) - 5:
        raise ConnectError("invalid_argument", "The request is not one enveloped message")
    return parse_message(bytes(body[5:]), model)


async def client_stream(request: Request) -> AsyncIterator[bytes]:
    """The request messages of a client-streaming call (enveloped JSON), each
    as it arrives: the client may send the next only after the last took effect."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != STREAM_CONTENT_TYPE:
        raise ConnectError(
            "unimplemented",
            f"Content-Type {media or '(none)'} is not served for a streaming call: kernelgw's envd takes "
            f"{STREAM_CONTENT_TYPE}, as E2B's SDKs send it",
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        while len(body) >= 5:
            flags, size = body[0], int.from_bytes(body[1:5], "big")
            if size > MAX_REQUEST_BYTES:
                raise ConnectError("resource_exhausted", f"A request message is larger than {MAX_REQUEST_BYTES} bytes")
            if flags & 0x01:
                raise ConnectError("unimplemented", "A compressed request message is not served")
            if len(body) < 5 + size:
                break
            message = bytes(body[5 : 5 + size])
            del body[: 5 + size]
            yield message
    if body:
        raise ConnectError("invalid_argument", "The request stream ended inside a message")


def parse_message(data: bytes, model: type[M]) -> M:
    """A request message in proto3 JSON, as ``model``; an invalid one is ``invalid_argument``."""
    try:
        parsed: Any = json.loads(data or b"{}")
    except ValueError as exc:
        raise ConnectError("invalid_argument", f"The request message is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ConnectError("invalid_argument", "The request message is not a JSON object")
    try:
        return model.model_validate({k: v for k, v in parsed.items() if v is not None})
    except ValidationError as exc:
        parts = [f"{'.'.join(str(x) for x in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()]
        raise ConnectError("invalid_argument", "Invalid request message: " + "; ".join(parts)) from None


def _gunzip(data: bytes) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, MAX_REQUEST_BYTES + 1)
    except zlib.error as exc:
        raise ConnectError("invalid_argument", f"The request message is not valid gzip: {exc}") from None
    if len(out) > MAX_REQUEST_BYTES:
        raise ConnectError("resource_exhausted", f"The request message is larger than {MAX_REQUEST_BYTES} bytes")
    return out


def timeout_s(request: Request) -> float | None:
    """The call's deadline from ``Connect-Timeout-Ms``, in seconds (None: none given)."""
    text = request.headers.get("connect-timeout-ms", "").strip()
    if not text.isdigit() or len(text) > 10:
        return None
    return int(text) / 1000


async def within_deadline(request: Request, work: Awaitable[M]) -> M:
    """``work``'s result, or ``deadline_exceeded`` when the call's deadline passes first."""
    limit = timeout_s(request)
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise
        raise ConnectError("deadline_exceeded", f"The call did not end within its deadline ({limit:g} s)") from None


def message_response(message: BaseModel) -> Response:
    """A unary call's answer: the message as proto3 JSON (fields by their JSON names, defaults left out)."""
    body = message.model_dump_json(by_alias=True, exclude_none=True)
    return Response(body, status_code=200, media_type="application/json")
