"""API keys and who is asking: the pure part of authentication.

A key reads ``kgw_<id>_<secret>``. The id is public (it names the key in
listings, the audit log and session ownership); the secret is 256 random bits,
shown once when the key is created and stored only as its SHA-256. A slow
password hash buys nothing for secrets of that strength (GitHub and Stripe
tokens are checked the same way), and a fast one keeps every request cheap.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any, Literal

Role = Literal["user", "admin"]
PREFIX = "kgw_"
_KEY = re.compile(r"^kgw_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class KeyQuotas:
    """Per-key limits; ``None`` means the gateway's own limit applies."""

    max_sessions: int | None = None
    max_memory_mb: int | None = None
    max_cpus: float | None = None
    max_timeout_s: float | None = None
    executions_per_minute: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyQuotas:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class ApiKey:
    id: str
    name: str
    role: Role
    secret_sha256: str
    created_at: datetime
    quotas: KeyQuotas = field(default_factory=KeyQuotas)
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(self.secret_sha256, hash_secret(secret))

    def describe(self) -> dict[str, Any]:
        """What listings show: everything but the hash."""
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role,
            "quotas": self.quotas.to_dict(),
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }


@dataclass(frozen=True)
class Principal:
    """Who a request acts for. ``key_id`` is None only when the gateway runs
    without authentication (loopback, no keys): then everyone is the admin."""

    key_id: str | None
    name: str
    role: Role
    quotas: KeyQuotas = field(default_factory=KeyQuotas)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def can_see(self, owner: str | None) -> bool:
        return self.is_admin or owner == self.key_id


ANONYMOUS = Principal(key_id=None, name="anonymous (authentication is off)", role="admin")


def new_key_id() -> str:
    return secrets.token_hex(6)


def new_secret() -> str:
    return secrets.token_urlsafe(32)  # 43 characters, 256 bits


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def format_key(key_id: str, secret: str) -> str:
    return f"{PREFIX}{key_id}_{secret}"


def parse_key(text: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed key, else None."""
    m = _KEY.match(text.strip())
    return (m.group(1), m.group(2)) if m else None


def bearer(header: str | None) -> str | None:
    """The credentials of an ``Authorization: Bearer <x>`` header, else None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
