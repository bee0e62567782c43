"""Who is asking: API keys on HTTP and WebSocket, browser tokens, key admin.

Every failure is the same 401 ("a valid API key is required"): whether a key
was malformed, unknown or revoked is not revealed. The checks themselves
(key lookup and its cache, tokens) are `kernelgw.server.authenticator`'s; this
module holds the request dependencies and the routes.

Browsers cannot set headers on a WebSocket, so a page trades its key for a
short-lived signed token (``POST /v1/auth/token``) and puts it on the
WebSocket URL. Tokens name the key, so revoking the key kills its tokens.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from kernelgw.errors import Forbidden
from kernelgw.keys import ANONYMOUS, ApiKey, KeyQuotas, Principal, bearer
from kernelgw.models import (
    ApiKeyList,
    BrowserToken,
    CreateApiKey,
    CreatedApiKey,
    WhoAmI,
)
from kernelgw.runtime.session import KernelSession
from kernelgw.server.authenticator import Authenticator as Authenticator
from kernelgw.server.authenticator import InsecureBind as InsecureBind
from kernelgw.server.authenticator import is_loopback as is_loopback
from kernelgw.server.state import gateway_state
from kernelgw.storage import Store
from kernelgw.storage import audit as audit_log


# ---------------------------------------------------------------- dependencies
async def authenticate(request: Request) -> Principal:
    """Router dependency: the request's principal (kept on ``request.state``)."""
    principal = await gateway_state(request).auth.from_key(bearer(request.headers.get("authorization")))
    request.state.principal = principal
    return principal


def principal_of(request: Request) -> Principal:
    return getattr(request.state, "principal", ANONYMOUS)


def session_for(request: Request, session_id: str) -> KernelSession:
    """The session if the caller may see it; another key's session is a 404."""
    return gateway_state(request).manager.get(session_id, principal_of(request))


async def require_admin(principal: Principal = Depends(authenticate)) -> Principal:
    if not principal.is_admin:
        raise Forbidden("This endpoint needs an admin API key.")
    return principal


# ---------------------------------------------------------------- routes
router = APIRouter(tags=["auth"])


@router.get("/v1/auth/whoami", response_model=WhoAmI)
async def whoami(request: Request, principal: Principal = Depends(authenticate)) -> dict[str, Any]:
    return {
        "auth": await gateway_state(request).auth.enabled(),
        "key_id": principal.key_id,
        "name": principal.name,
        "role": principal.role,
        "quotas": principal.quotas.to_dict(),
    }


@router.post("/v1/auth/token", response_model=BrowserToken)
async def browser_token(request: Request, principal: Principal = Depends(authenticate)) -> dict[str, Any]:
    """A short-lived token for WebSocket URLs (``?token=``), for browsers."""
    token, expires = gateway_state(request).auth.issue_token(principal)
    return {"token": token, "expires_at": expires}


@router.get("/v1/keys", response_model=ApiKeyList, dependencies=[Depends(require_admin)])
async def list_keys(request: Request) -> dict[str, Any]:
    keys = await gateway_state(request).auth.keys.list()
    return {"keys": [k.describe() for k in keys]}


@router.post("/v1/keys", status_code=201, response_model=CreatedApiKey)
async def create_key(body: CreateApiKey, request: Request, admin: Principal = Depends(require_admin)) -> dict[str, Any]:
    """A new key; the response is the only place its secret ever appears."""
    auth = gateway_state(request).auth
    quotas = KeyQuotas(**body.quotas.model_dump()) if body.quotas else KeyQuotas()
    key, text = await auth.keys.create(body.name, body.role, quotas)
    record_key_event(auth.store, "key_created", key, by=admin.key_id)
    return {**key.describe(), "key": text}


@router.delete("/v1/keys/{key_id}", status_code=204)
async def revoke_key(key_id: str, request: Request, admin: Principal = Depends(require_admin)) -> Response:
    auth = gateway_state(request).auth
    key = await auth.keys.revoke(key_id)
    if key is None:
        from kernelgw.errors import BadRequest

        raise BadRequest(f"There is no API key with id {key_id!r}.")
    auth.forget(key_id)
    record_key_event(auth.store, "key_revoked", key, by=admin.key_id)
    return Response(status_code=204)


def record_key_event(store: Store, kind: str, key: ApiKey, by: str | None) -> None:
    detail = f"name={key.name!r} role={key.role}" + (f" by={by}" if by else "")
    audit_log.record(store, audit_log.AuditRecord(at=datetime.now(UTC), kind=kind, key_id=key.id, detail=detail))
