"""Who calls E2B's control plane, and each sandbox's access token.

The SDK sends ``E2B_API_KEY`` as ``X-API-KEY``; ``Authorization: Bearer`` is
taken too (as on ``/v1``). It is a kernelgw API key: the principal is
`Authenticator.from_key`'s, so ownership, quotas and audit are /v1's.

Sandbox traffic carries no key but the sandbox's access token
(``envdAccessToken``). The gateway keeps only its sha256 (the session's
``access_sha256``), yet ``connect`` must give the same token again to whoever
holds the key (E2B's SDK keeps using the token it has, and ``Sandbox.connect(id)``
from another process takes the one connect answers). So the token is derived,
not stored: an HMAC-SHA256, keyed with the text of the API key that created the
sandbox, of a random nonce kept in the sandbox's metadata (`ACCESS_NONCE_KEY`).
Neither the nonce nor anything else the store holds gives the token without
the key; the key gives it, as it gives ``connect``. Without authentication
(no keys) anyone may connect anyway, and the HMAC key is a constant.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request
from starlette.datastructures import Headers

from kernelgw.errors import SessionNotFound
from kernelgw.keys import ANONYMOUS, Principal, bearer
from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b.models import RESERVED_PREFIX
from kernelgw.server.state import GatewayState, gateway_state

API_KEY_HEADER = "X-API-KEY"
SANDBOX_ID_HEADER = "E2b-Sandbox-Id"
ACCESS_TOKEN_HEADERS = ("X-Access-Token", "E2B-Traffic-Access-Token")
"""Where sandbox traffic carries the sandbox's token (the code interpreter's
context calls send only the second)."""
ACCESS_NONCE_KEY = RESERVED_PREFIX + "access-nonce"
_OPEN_KEY = "kernelgw: authentication is off"
_CONTEXT = b"kernelgw e2b envd access token\x00"


@dataclass(frozen=True)
class Caller:
    principal: Principal
    key: str | None
    """The API key's text as sent (None without authentication): the sandboxes'
    access tokens derive from it."""


def key_text(headers: Headers) -> str | None:
    """The API key of a request: ``X-API-KEY``, else ``Authorization: Bearer``."""
    value = headers.get(API_KEY_HEADER)
    if value and value.strip():
        return value.strip()
    return bearer(headers.get("authorization"))


async def authenticate(request: Request) -> Caller:
    """Router dependency: the caller (`Unauthorized` without a valid key)."""
    text = key_text(request.headers)
    principal = await gateway_state(request).auth.from_key(text)
    request.state.principal = principal
    return Caller(principal, text if principal.key_id is not None else None)


# ---------------------------------------------------------------- access tokens
def derive_token(key: str | None, nonce: str) -> str:
    digest = hmac.new((key or _OPEN_KEY).encode(), _CONTEXT + nonce.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Access:
    """A new sandbox's token: the nonce goes into its metadata, the hash into its options."""

    nonce: str
    token: str

    @property
    def sha256(self) -> str:
        return token_sha256(self.token)


def new_access(caller: Caller) -> Access:
    nonce = secrets.token_urlsafe(16)
    return Access(nonce, derive_token(caller.key, nonce))


def access_token(caller: Caller, session: KernelSession) -> str | None:
    """The sandbox's token as ``caller`` derives it, if it is the sandbox's (the
    caller holds the key that created it); None otherwise."""
    nonce = session.metadata.get(ACCESS_NONCE_KEY)
    if not nonce:
        return None
    token = derive_token(caller.key, nonce)
    return token if session.check_access(token) else None


def sandbox_access(state: GatewayState, headers: Headers) -> bool:
    """Whether a request is sandbox traffic with the right token for the sandbox it names."""
    sandbox_id = headers.get(SANDBOX_ID_HEADER)
    if not sandbox_id:
        return False
    try:
        session = state.manager.get(sandbox_id, ANONYMOUS)  # any key's: the token decides
    except SessionNotFound:
        return False
    return any(session.check_access(token) for name in ACCESS_TOKEN_HEADERS if (token := headers.get(name)))
