"""The `ClientError` for an error answer of the gateway: an HTTP error response
(`error_from_response`) or a WebSocket closed with a ``4xxx`` code
(`error_from_close`, ``4404`` means HTTP 404 and so on).
"""

from __future__ import annotations

import contextlib
import json

from kernelgw.errors import ClientError


def _error_code_for(status_code: int) -> str:
    return {
        400: "bad_request",
        404: "not_found",
        405: "method_not_allowed",
        409: "conflict",
        422: "validation_error",
        429: "too_many_requests",
        500: "internal_error",
        502: "bad_gateway",
        503: "unavailable",
    }.get(status_code, f"http_{status_code}")


def error_from_response(status_code: int, content: bytes | str, reason: str = "") -> ClientError:
    """The `ClientError` for an error answer.

    Understands kernelgw's ``{"error": {"code", "message"}}``, FastAPI's default
    ``{"detail": ...}`` (unknown route, validation error) and plain text.
    """
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    code, message = _error_code_for(status_code), ""
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = str(body["error"].get("code") or code)
        message = str(body["error"].get("message") or "")
    elif isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list):  # pydantic validation errors
            message = "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg', '')}" if isinstance(d, dict) else str(d)
                for d in detail
            )
        else:
            message = str(detail)
    elif text and body is None:
        message = text.strip()[:500]
    return ClientError(status_code, code, message or reason or "request failed")


def error_from_close(code: int | None, reason: str) -> ClientError:
    """The `ClientError` for a WebSocket closed by the gateway with ``4xxx``.

    ``4404`` means HTTP 404 and so on; a JSON reason ``{"code", "message"}`` is
    understood, any other reason is the message.
    """
    assert code is not None and 4000 <= code < 5000
    status = code - 4000
    err_code = "session_not_found" if status == 404 else _error_code_for(status)
    message = reason
    with contextlib.suppress(ValueError):
        body = json.loads(reason)
        if isinstance(body, dict):
            body = body.get("error", body)
            if isinstance(body, dict):
                err_code = str(body.get("code") or err_code)
                message = str(body.get("message") or "")
    return ClientError(status, err_code, message or f"WebSocket closed with code {code}")
