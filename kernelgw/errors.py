"""Exceptions, one root, each mapped to an HTTP status at the API boundary.

KernelGWError
├── BadRequest                 400
│   ├── LimitExceeded          400  (asked for more than the gateway allows)
│   ├── InvalidPath            400  (workspace path: absolute, .., NUL, symlink, ...)
│   ├── PackageNotAllowed      400  (not on the gateway's package allowlist)
│   ├── PolicyViolation        400  (the code policy refused a cell; names the rule)
│   ├── KernelNotOffered       400  (a kernel name the gateway does not offer; lists those it does)
│   └── KernelNotInImage       400  (a context's language the sandbox's image does not hold)
├── Unauthorized               401  (missing, malformed, unknown or revoked key/token)
├── Forbidden                  403  (an admin-only endpoint, asked by a user key)
├── PayloadTooLarge            413
│   └── QuotaExceeded          413  (per-file or workspace quota, or tmpfs full)
├── FileNotFoundInWorkspace    404
├── PackageUnavailable         422  (allowed, but no wheel fits / resolution failed)
├── PackageInstallFailed       500  (pip failed inside the container)
├── SessionNotFound            404
├── ChildNotFound              404  (no such context in the sandbox, or why it ended)
├── HistoryNotFound            404  (no stored history for that session id)
├── SessionBusy                409
├── NotForThisKernel           409  (packages, pause: Python kernels only)
├── GatewayNameInUse           409  (another live gateway process holds this gateway name here)
├── SessionLimitReached        429
├── RateLimited                429  (executions per minute; carries Retry-After)
├── KernelDied                 409  (the kernel is gone; restart the session)
├── BackendError               503
│   ├── EngineUnavailable      503  (Docker engine not answering)
│   ├── ImageNotFound          503
│   └── KernelStartFailed      503
├── StorageUnavailable         503  (the history database does not answer or cannot write)
├── GatewayDraining            503  (shutting down; retry, another gateway or this one restarted)
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


class PolicyViolation(BadRequest):
    code = "policy_violation"


class KernelNotOffered(BadRequest):
    code = "kernel_not_offered"


class KernelNotInImage(BadRequest):
    """A child kernel (an E2B context) of a language its session's image lacks."""

    code = "kernel_not_in_image"


class Unauthorized(KernelGWError):
    """One message for every failure: which part was wrong is not revealed."""

    status_code = 401
    code = "unauthorized"

    def __init__(self, message: str = "A valid API key is required: send 'Authorization: Bearer <key>'.") -> None:
        super().__init__(message)


class Forbidden(KernelGWError):
    status_code = 403
    code = "forbidden"


class RateLimited(KernelGWError):
    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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


class ChildNotFound(KernelGWError):
    """A child session (an E2B context) its parent does not hold."""

    status_code = 404
    code = "context_not_found"


class HistoryNotFound(KernelGWError):
    status_code = 404
    code = "history_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"No history for session {session_id!r}: no such session was recorded, or its "
            "history was purged after the gateway's retention period (history_retention_days)."
        )
        self.session_id = session_id


class SessionBusy(KernelGWError):
    status_code = 409
    code = "session_busy"


class NotForThisKernel(KernelGWError):
    """What only a Python kernel can do (install packages, pickle its namespace)."""

    status_code = 409
    code = "not_for_this_kernel"


class GatewayNameInUse(KernelGWError):
    """A gateway with this name is alive on this host: starting a second one
    would reap its kernel containers (they are found by the name's label)."""

    status_code = 409
    code = "gateway_name_in_use"


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


class UidsExhausted(BackendError):
    """Every uid of ``kernel_uid_range`` is held by a session on this host."""

    code = "kernel_uids_exhausted"


class StorageUnavailable(KernelGWError):
    status_code = 503
    code = "storage_unavailable"


class GatewayDraining(KernelGWError):
    status_code = 503
    code = "gateway_draining"


# --- workspace files and packages


class InvalidPath(BadRequest):
    code = "invalid_path"


class QuotaExceeded(PayloadTooLarge):
    code = "quota_exceeded"


class FileNotFoundInWorkspace(KernelGWError):
    status_code = 404
    code = "file_not_found"


class WorkspaceCopyFailed(KernelGWError):
    status_code = 500
    code = "workspace_copy_failed"


class WorkspaceUnreadable(KernelGWError):
    """A copy of the workspace (pause, fork, snapshot) met a file the session's
    user may not read: made so by the session itself (a root command, chmod)."""

    status_code = 409
    code = "workspace_unreadable"


class PackageNotAllowed(BadRequest):
    code = "package_not_allowed"


class PackageUnavailable(KernelGWError):
    status_code = 422
    code = "package_unavailable"


class PackageInstallFailed(KernelGWError):
    status_code = 500
    code = "package_install_failed"


# ---


class ClientError(KernelGWError):
    """Raised by the SDK when the gateway answers with an error."""

    def __init__(self, status_code: int, code: str, message: str) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
