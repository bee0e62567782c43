"""Who is asking: API keys on HTTP and WebSocket, browser tokens, key admin.

Every failure is the same 401 ("a valid API key is required"): whether a key
was malformed, unknown or revoked is not revealed. Keys are looked up in the
database and trusted for ``auth_cache_s``; a key revoked over the API stops
working at once, one revoked from the CLI within that time.

Browsers cannot set headers on a WebSocket, so a page trades its key for a
short-lived signed token (``POST /v1/auth/token``) and puts it on the
WebSocket URL. Tokens name the key, so revoking the key kills its tokens.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from kernelgw.config import Settings
from kernelgw.errors import Forbidden, KernelGWError, StorageUnavailable, Unauthorized
from kernelgw.keys import ANONYMOUS, ApiKey, KeyQuotas, Principal, bearer, parse_key
from kernelgw.models import (
    ApiKeyList,
    BrowserToken,
    CreateApiKey,
    CreatedApiKey,
    WhoAmI,
)
from kernelgw.storage import Store
from kernelgw.storage import audit as audit_log
from kernelgw.storage.keys import KeyStore

if TYPE_CHECKING:
    from kernelgw.runtime.session import KernelSession

log = logging.getLogger(__name__)

_CACHE_MAX = 10_000


class InsecureBind(KernelGWError):
    """Raised at start-up: no authentication, yet listening beyond loopback."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Authenticator:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.keys = KeyStore(store)
        self._cache: dict[str, tuple[ApiKey | None, float]] = {}
        self._enabled = settings.auth == "required"
        self._checked = 0.0
        secret = settings.token_secret.get_secret_value() if settings.token_secret else secrets.token_bytes(32)
        self._tokens = URLSafeTimedSerializer(secret, salt="kernelgw-websocket")

    async def check_startup(self) -> None:
        """Refuse to serve beyond loopback without authentication (unless told to)."""
        s = self.settings
        try:
            enabled = await self.enabled()
            if s.auth == "required" and await self.keys.count() == 0:
                log.warning("authentication is required but no API key exists: create one with `kernelgw keys create`")
        except StorageUnavailable:
            # Keys cannot be read: requests are refused (503) until the database
            # answers, so starting is safe; sessions already running are unaffected.
            log.error("cannot read API keys: the database does not answer; requests get 503 until it does")
            return
        if not enabled and not is_loopback(s.host) and not s.allow_remote_without_auth:
            raise InsecureBind(
                f"Refusing to listen on {s.host} without authentication: create an API key "
                "(`kernelgw keys create NAME`), or listen on 127.0.0.1, or pass "
                "--insecure-allow-remote (KERNELGW_ALLOW_REMOTE_WITHOUT_AUTH=1) if something "
                "in front of the gateway authenticates."
            )
        if not enabled:
            log.warning("authentication is off: anyone who can reach %s:%s can run code", s.host, s.port)

    async def enabled(self) -> bool:
        """``auto`` turns on once any key exists and stays on for this process."""
        if self._enabled or self.settings.auth == "off":
            return self._enabled
        now = time.monotonic()
        if now - self._checked >= self.settings.auth_cache_s:
            self._checked = now
            self._enabled = await self.keys.count() > 0
        return self._enabled

    # ------------------------------------------------------------ lookups
    async def _key(self, key_id: str) -> ApiKey | None:
        hit = self._cache.get(key_id)
        now = time.monotonic()
        if hit is not None and now - hit[1] < self.settings.auth_cache_s:
            return hit[0]
        key = await self.keys.get(key_id)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[key_id] = (key, now)
        return key

    async def key_active(self, key_id: str) -> bool:
        try:
            key = await self._key(key_id)
        except KernelGWError:
            return True  # the database is down: keep what is open, refuse what is new
        return key is not None and key.active

    def forget(self, key_id: str) -> None:
        self._cache.pop(key_id, None)

    @staticmethod
    def _principal(key: ApiKey) -> Principal:
        return Principal(key_id=key.id, name=key.name, role=key.role, quotas=key.quotas)

    async def from_key(self, text: str | None) -> Principal:
        if not await self.enabled():
            return ANONYMOUS
        parsed = parse_key(text) if text else None
        if parsed is not None:
            key = await self._key(parsed[0])
            if key is not None and key.active and key.matches(parsed[1]):
                return self._principal(key)
        raise Unauthorized()

    async def from_websocket(self, authorization: str | None, token: str | None) -> Principal:
        if not await self.enabled():
            return ANONYMOUS
        if token and not authorization:
            key = await self._key(self.token_key_id(token))
            if key is None or not key.active:
                raise Unauthorized()
            return self._principal(key)
        return await self.from_key(bearer(authorization))

    def token_key_id(self, token: str) -> str:
        """The key a browser token was issued to, if it is genuine and fresh."""
        try:
            return str(self._tokens.loads(token, max_age=self.settings.browser_token_ttl_s)["k"])
        except (BadSignature, KeyError, TypeError):
            raise Unauthorized("The token is invalid or expired; get a new one from POST /v1/auth/token.") from None

    def issue_token(self, principal: Principal) -> tuple[str, datetime]:
        expires = datetime.now(UTC) + timedelta(seconds=self.settings.browser_token_ttl_s)
        # the nonce makes every token distinct, also two issued in the same second
        return self._tokens.dumps({"k": principal.key_id, "n": secrets.token_hex(8)}), expires


# ---------------------------------------------------------------- dependencies
async def authenticate(request: Request) -> Principal:
    """Router dependency: the request's principal (kept on ``request.state``)."""
    auth: Authenticator = request.app.state.auth
    principal = await auth.from_key(bearer(request.headers.get("authorization")))
    request.state.principal = principal
    return principal


def principal_of(request: Request) -> Principal:
    return getattr(request.state, "principal", ANONYMOUS)  # type: ignore[no-any-return]


def session_for(request: Request, session_id: str) -> KernelSession:
    """The session if the caller may see it; another key's session is a 404."""
    return request.app.state.manager.get(session_id, principal_of(request))  # type: ignore[no-any-return]


async def require_admin(principal: Principal = Depends(authenticate)) -> Principal:
    if not principal.is_admin:
        raise Forbidden("This endpoint needs an admin API key.")
    return principal


def same_origin(origin: str | None, host: str | None, allowed: list[str]) -> bool:
    """A browser page from another site must not drive a session (cross-site
    WebSocket hijacking): the Origin must be this gateway or an allowed one.
    Non-browser clients send no Origin and pass."""
    if not origin:
        return True
    if origin in allowed or "*" in allowed:
        return True
    return bool(host) and urlsplit(origin).netloc.lower() == (host or "").lower()


# ---------------------------------------------------------------- routes
router = APIRouter(tags=["auth"])


@router.get("/v1/auth/whoami", response_model=WhoAmI)
async def whoami(request: Request, principal: Principal = Depends(authenticate)) -> dict[str, Any]:
    return {
        "auth": await request.app.state.auth.enabled(),
        "key_id": principal.key_id,
        "name": principal.name,
        "role": principal.role,
        "quotas": principal.quotas.to_dict(),
    }


@router.post("/v1/auth/token", response_model=BrowserToken)
async def browser_token(request: Request, principal: Principal = Depends(authenticate)) -> dict[str, Any]:
    """A short-lived token for WebSocket URLs (``?token=``), for browsers."""
    token, expires = request.app.state.auth.issue_token(principal)
    return {"token": token, "expires_at": expires}


@router.get("/v1/keys", response_model=ApiKeyList, dependencies=[Depends(require_admin)])
async def list_keys(request: Request) -> dict[str, Any]:
    keys = await request.app.state.auth.keys.list()
    return {"keys": [k.describe() for k in keys]}


@router.post("/v1/keys", status_code=201, response_model=CreatedApiKey)
async def create_key(body: CreateApiKey, request: Request, admin: Principal = Depends(require_admin)) -> dict[str, Any]:
    """A new key; the response is the only place its secret ever appears."""
    auth: Authenticator = request.app.state.auth
    quotas = KeyQuotas(**body.quotas.model_dump()) if body.quotas else KeyQuotas()
    key, text = await auth.keys.create(body.name, body.role, quotas)
    record_key_event(auth.store, "key_created", key, by=admin.key_id)
    return {**key.describe(), "key": text}


@router.delete("/v1/keys/{key_id}", status_code=204)
async def revoke_key(key_id: str, request: Request, admin: Principal = Depends(require_admin)) -> Response:
    auth: Authenticator = request.app.state.auth
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
