"""``kernelgw keys`` and ``kernelgw audit``: administration on the gateway's database.

These work on the database directly (the settings' ``database_url``, or the
SQLite file in ``data_dir``), with or without a gateway running: a running one
sees a new key at once and a revoked key within ``auth_cache_s``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click

from kernelgw.audit_kinds import KINDS
from kernelgw.cli.extras import server_extra

T = TypeVar("T")

config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Settings file (.json or .toml) naming the database; KERNELGW_* env vars override it.",
)


def _with_store(command: str, config_file: Path | None, work: Callable[[Any], Awaitable[T]]) -> T:
    from pydantic import ValidationError

    from kernelgw.errors import KernelGWError

    with server_extra(command):
        from kernelgw.config import Settings
        from kernelgw.storage import Store

    try:
        settings = Settings.load(config_file)
    except (ValidationError, ValueError) as exc:
        raise click.ClickException(f"invalid settings: {exc}") from exc

    async def run() -> T:
        store = Store.from_settings(settings)
        await store.start(background=False)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except KernelGWError as exc:
        raise click.ClickException(exc.message) from exc


def _console() -> Any:
    from rich.console import Console

    # piped into a file or another program, do not squeeze columns into 80
    return Console(width=None if sys.stdout.isatty() else 200)


# ------------------------------------------------------------------------ keys
@click.group()
def keys() -> None:
    """Create, list and revoke API keys."""


@keys.command("create")
@click.argument("name")
@click.option("--admin", is_flag=True, help="An admin key: sees and ends every session, manages keys.")
@click.option("--max-sessions", type=click.IntRange(min=1), default=None, help="Sessions it may hold at once.")
@click.option("--max-memory-mb", type=click.IntRange(min=64), default=None, help="Most memory a session may ask for.")
@click.option(
    "--max-cpus", type=click.FloatRange(min=0, min_open=True), default=None, help="Most CPUs a session may ask for."
)
@click.option(
    "--max-timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Longest execution timeout (s)."
)
@click.option(
    "--executions-per-minute", type=click.IntRange(min=1), default=None, help="Executions it may start per minute."
)
@click.option("--json", "as_json", is_flag=True, help="Print the key and its record as JSON.")
@config_option
def create_key(
    name: str,
    admin: bool,
    max_sessions: int | None,
    max_memory_mb: int | None,
    max_cpus: float | None,
    max_timeout: float | None,
    executions_per_minute: int | None,
    as_json: bool,
    config_file: Path | None,
) -> None:
    """Create a key named NAME. The key is printed once and never stored."""
    from kernelgw.keys import KeyQuotas

    with server_extra("keys create"):
        from kernelgw.storage import audit
        from kernelgw.storage.keys import KeyStore

    quotas = KeyQuotas(max_sessions, max_memory_mb, max_cpus, max_timeout, executions_per_minute)

    async def work(store: Any) -> tuple[Any, str]:
        key, text = await KeyStore(store).create(name, "admin" if admin else "user", quotas)
        await audit.write_now(
            store,
            audit.AuditRecord(
                at=datetime.now(UTC),
                kind="key_created",
                key_id=key.id,
                detail=f"name={name!r} role={key.role} by=cli",
            ),
        )
        return key, text

    key, text = _with_store("keys create", config_file, work)
    if as_json:
        click.echo(_key_json(key, key=text))
        return
    click.echo(text)
    click.echo(
        f"created {key.role} key {key.id} ({name}); store it now: it is shown only once. "
        "Send it as 'Authorization: Bearer <key>' (or KERNELGW_API_KEY for the SDK and CLI).",
        err=True,
    )


def _key_json(record: Any, **extra: Any) -> str:
    return json.dumps({**record.describe(), **extra}, default=lambda d: d.isoformat())


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@config_option
def list_keys(as_json: bool, config_file: Path | None) -> None:
    """Every key (ids, names, roles, quotas; never secrets)."""
    with server_extra("keys list"):
        from kernelgw.storage.keys import KeyStore

    async def work(store: Any) -> list[Any]:
        return await KeyStore(store).list()

    found = _with_store("keys list", config_file, work)
    if as_json:
        for key in found:
            click.echo(_key_json(key))
        return
    from rich.table import Table

    table = Table("id", "name", "role", "quotas", "created", "revoked")
    for key in found:
        quotas = ", ".join(f"{k}={v}" for k, v in key.quotas.to_dict().items()) or "-"
        table.add_row(
            key.id,
            key.name,
            key.role,
            quotas,
            key.created_at.strftime("%Y-%m-%d %H:%M"),
            key.revoked_at.strftime("%Y-%m-%d %H:%M") if key.revoked_at else "",
        )
    _console().print(table)


@keys.command("revoke")
@click.argument("key_id")
@config_option
def revoke_key(key_id: str, config_file: Path | None) -> None:
    """Revoke KEY_ID (the id from `keys list`, or a whole key)."""
    from kernelgw.keys import parse_key

    with server_extra("keys revoke"):
        from kernelgw.storage import audit
        from kernelgw.storage.keys import KeyStore

    parsed = parse_key(key_id)
    key_id = parsed[0] if parsed else key_id

    async def work(store: Any) -> Any:
        key = await KeyStore(store).revoke(key_id)
        if key is not None:
            await audit.write_now(
                store,
                audit.AuditRecord(
                    at=datetime.now(UTC), kind="key_revoked", key_id=key.id, detail=f"name={key.name!r} by=cli"
                ),
            )
        return key

    key = _with_store("keys revoke", config_file, work)
    if key is None:
        raise click.ClickException(f"no API key with id {key_id!r} (see `kernelgw keys list`)")
    click.echo(f"revoked {key.id} ({key.name})")


# ------------------------------------------------------------------------ audit
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """``30m``, ``2h``, ``7d`` (ago) or an ISO 8601 time (UTC unless it says)."""
    now = now or datetime.now(UTC)
    m = _AGO.match(text.strip())
    if m:
        return now - timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: use e.g. 30m, 2h, 7d or 2026-11-22T10:00") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@click.command()
@click.option("--since", default=None, help="From when: 30m, 2h, 7d or an ISO time.")
@click.option("--until", default=None, help="Until when (same forms).")
@click.option("--key", "key_id", default=None, help="Only this API key id.")
@click.option("--session", "session_id", default=None, help="Only this session.")
@click.option("--kind", type=click.Choice(KINDS), default=None, help="Only this kind of record.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many records.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (the export format), with the full code.")
@config_option
def audit(
    since: str | None,
    until: str | None,
    key_id: str | None,
    session_id: str | None,
    kind: str | None,
    limit: int | None,
    as_json: bool,
    config_file: Path | None,
) -> None:
    """Query the audit log: executions (who ran what code, how it ended) and
    session and key lifecycle events, oldest first."""
    with server_extra("audit"):
        from kernelgw.storage import audit as audit_log

    start = parse_when(since) if since else None
    end = parse_when(until) if until else None

    async def work(store: Any) -> list[Any]:
        return await audit_log.query(
            store, since=start, until=end, key_id=key_id, session_id=session_id, kind=kind, limit=limit
        )

    rows = _with_store("audit", config_file, work)
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row.to_json_dict()) + "\n")
        return
    from rich.table import Table

    table = Table("time", "kind", "key", "session", "status", "ms", "bytes", "error", "code / detail")
    for row in rows:
        first = (row.code or row.detail or "").strip().splitlines()
        table.add_row(
            row.at.strftime("%Y-%m-%d %H:%M:%S"),
            row.kind,
            row.key_id or "-",
            (row.session_id or "-")[:12],
            row.status or "",
            f"{row.duration_ms:.0f}" if row.duration_ms is not None else "",
            str(row.output_bytes) if row.output_bytes is not None else "",
            row.error_name or "",
            (first[0][:60] + (" ..." if len(first) > 1 or len(first[0]) > 60 else "")) if first else "",
        )
    _console().print(table)
    click.echo(f"{len(rows)} records", err=True)
