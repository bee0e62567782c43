"""Exceptions, one root, each mapped to an HTTP status at the API boundary.

    KernelGWError
    ├── BadRequest                 400
    │   └── LimitExceeded          400  (asked for more than the gateway allows)
    ├── PayloadTooLarge            413
    ├── SessionNotFound            404
    ├── SessionBusy                409
    ├── SessionLimitReached        429
    ├── KernelDied                 409  (the kernel is gone; restart the session)
    ├── BackendError               503
    │   ├── EngineUnavailable      503  (Docker engine not answering)
    │   ├── ImageNotFound          503
    │   └── KernelStartFailed      503
    └── ClientError                (SDK side) an HTTP error answer from a gateway
"""

from __future__ import annotations


class KernelGWError(Exception):
    status_code: int = 500
    code: str = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class BadRequest(KernelGWError):
    status_code = 400
    code = "bad_request"


class LimitExceeded(BadRequest):
    code = "limit_exceeded"


class PayloadTooLarge(KernelGWError):
    status_code = 413
    code = "payload_too_large"


class SessionNotFound(KernelGWError):
    status_code = 404
    code = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"No session {session_id!r}. It may have been deleted or reaped after "
            "being idle; create a new one with POST /v1/sessions."
        )
        self.session_id = session_id


class SessionBusy(KernelGWError):
    status_code = 409
    code = "session_busy"


class SessionLimitReached(KernelGWError):
    status_code = 429
    code = "session_limit_reached"


class KernelDied(KernelGWError):
    status_code = 409
    code = "kernel_dead"


class BackendError(KernelGWError):
    status_code = 503
    code = "backend_error"


class EngineUnavailable(BackendError):
    code = "engine_unavailable"


class ImageNotFound(BackendError):
    code = "image_not_found"


class KernelStartFailed(BackendError):
    code = "kernel_start_failed"


class ClientError(KernelGWError):
    """Raised by the SDK when the gateway answers with an error."""

    def __init__(self, status_code: int, code: str, message: str) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
