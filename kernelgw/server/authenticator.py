"""The key and token checks behind every request: which key is asking, whether
authentication is on, browser tokens.

Keys are looked up in the database and trusted for ``auth_cache_s``; a key
revoked over the API stops working at once (`Authenticator.forget`), one
revoked from the CLI within that time. A browser token is signed, names its
key and expires after ``browser_token_ttl_s``; revoking the key kills it.
The routes and request dependencies that use this are in `kernelgw.server.auth`.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import secrets
import time
from datetime import UTC, datetime, timedelta

from itsdangerous import BadSignature, URLSafeTimedSerializer

from kernelgw.config import Settings
from kernelgw.errors import KernelGWError, StorageUnavailable, Unauthorized
from kernelgw.keys import ANONYMOUS, ApiKey, Principal, bearer, parse_key
from kernelgw.storage import Store
from kernelgw.storage.keys import KeyStore

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

    async def key_principal(self, key_id: str) -> Principal | None:
        """Who an active key is (looked up as `from_key` does, cached), None when it
        is unknown or revoked: for a face whose credential is not the key itself
        (E2B's sandbox traffic carries the sandbox's token) and acts for the key
        that owns the session."""
        key = await self._key(key_id)
        return self._principal(key) if key is not None and key.active else None

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

    async def from_key_or_token(self, authorization: str | None, token: str | None) -> Principal:
        """A key in the header, or a browser token (``?token=``) where a browser
        cannot set headers: WebSockets, and pages it opens itself (/docs)."""
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
            # ages are whole seconds: the floor refuses exactly the tokens the float limit would
            max_age = math.floor(self.settings.browser_token_ttl_s)
            return str(self._tokens.loads(token, max_age=max_age)["k"])
        except (BadSignature, KeyError, TypeError):
            raise Unauthorized("The token is invalid or expired; get a new one from POST /v1/auth/token.") from None

    def issue_token(self, principal: Principal) -> tuple[str, datetime]:
        expires = datetime.now(UTC) + timedelta(seconds=self.settings.browser_token_ttl_s)
        # the nonce makes every token distinct, also two issued in the same second
        return self._tokens.dumps({"k": principal.key_id, "n": secrets.token_hex(8)}), expires
