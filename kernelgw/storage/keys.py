"""API keys in the gateway's database: created, listed, looked up, revoked.

Writes go straight to the database (not through the history writer's queue):
they are rare, and the caller must know they landed before it shows a key.
The CLI uses this on the same database a running gateway reads, so
``kernelgw keys revoke`` takes effect on a live gateway within its key cache
time (``auth_cache_s``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, update

from kernelgw.keys import (
    ApiKey,
    KeyQuotas,
    Role,
    format_key,
    hash_secret,
    new_key_id,
    new_secret,
)
from kernelgw.storage import schema
from kernelgw.storage.records import as_utc
from kernelgw.storage.store import Store


def _record(row: Any) -> ApiKey:
    return ApiKey(
        id=row.id,
        name=row.name,
        role=row.role,
        secret_sha256=row.secret_sha256,
        created_at=as_utc(row.created_at),
        quotas=KeyQuotas.from_dict(json.loads(row.quotas or "{}")),
        revoked_at=as_utc(row.revoked_at) if row.revoked_at is not None else None,
    )


class KeyStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def create(self, name: str, role: Role = "user", quotas: KeyQuotas | None = None) -> tuple[ApiKey, str]:
        """A new key and its full text, which exists nowhere else afterwards."""
        if role not in ("user", "admin"):
            raise ValueError("role must be 'user' or 'admin'")
        key_id, secret = new_key_id(), new_secret()
        key = ApiKey(
            id=key_id,
            name=name,
            role=role,
            secret_sha256=hash_secret(secret),
            created_at=datetime.now(UTC),
            quotas=quotas or KeyQuotas(),
        )
        engine = await self.store.read_engine()
        async with engine.begin() as conn:
            await conn.execute(
                insert(schema.api_keys).values(
                    id=key.id,
                    name=key.name,
                    role=key.role,
                    secret_sha256=key.secret_sha256,
                    quotas=json.dumps(key.quotas.to_dict()),
                    created_at=key.created_at,
                )
            )
        return key, format_key(key_id, secret)

    async def get(self, key_id: str) -> ApiKey | None:
        engine = await self.store.read_engine()
        async with engine.connect() as conn:
            row = (await conn.execute(select(schema.api_keys).where(schema.api_keys.c.id == key_id))).first()
        return _record(row) if row is not None else None

    async def list(self, include_revoked: bool = True) -> list[ApiKey]:
        engine = await self.store.read_engine()
        t = schema.api_keys
        query = select(t).order_by(t.c.created_at, t.c.id)
        if not include_revoked:
            query = query.where(t.c.revoked_at.is_(None))
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [_record(r) for r in rows]

    async def count(self) -> int:
        """All keys ever created, revoked ones included: revoking the last key
        must not turn authentication off."""
        engine = await self.store.read_engine()
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(schema.api_keys))).scalar_one())

    async def revoke(self, key_id: str) -> ApiKey | None:
        """The revoked key, or None when there is no such key."""
        engine = await self.store.read_engine()
        t = schema.api_keys
        async with engine.begin() as conn:
            await conn.execute(
                update(t).where(t.c.id == key_id, t.c.revoked_at.is_(None)).values(revoked_at=datetime.now(UTC))
            )
        return await self.get(key_id)
