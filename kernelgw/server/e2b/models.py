"""E2B's control-plane wire shapes, as E2B's OpenAPI spec names them (camelCase,
``templateID``, ``sandboxID``; ``allow_internet_access`` is snake_case there too).

Requests keep fields kernelgw does not know instead of dropping them, so a
route can refuse them by name (`unknown_fields`): a newer SDK asking for
something this face does not do gets a 400 that says what, never a silent
no-op. Answers are dumped by alias with ``None`` left out (E2B's optional
fields are absent, not null).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from kernelgw.runtime.lease import MAX_METADATA_ENTRIES, MAX_METADATA_KEY, MAX_METADATA_VALUE
from kernelgw.runtime.lease import RESERVED_PREFIX as RESERVED_PREFIX

MAX_METADATA_ITEMS = MAX_METADATA_ENTRIES
"""A client's labels: all the runtime keeps (the face's own entries, `RESERVED_PREFIX`:
the template, the token's nonce, a create's ``Idempotency-Key``, a snapshot's
source and name, are not counted)."""

ENVD_VERSION = "0.6.4"
"""The envd version sandboxes claim: the newest whose features E2B's SDKs
(Python 2.63, JavaScript 2.51) check, all of which this face serves: recursive
watches (0.1.4), metrics (0.1.5, disk 0.2.4), commands' stdin switch (0.3.0),
the default user (0.4.0: the SDK names no user; the sandbox has one),
closing stdin (0.5.2), raw and gzip-encoded uploads (0.5.7: octet-stream),
file metadata (0.6.2), entries in watch events (0.6.3) and the network-mount
switch of a watch (0.6.4: a workspace is never one)."""
CLIENT_ID = "kernelgw"
"""``clientID`` of every sandbox (E2B's is a fixed placeholder too)."""


def check_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """A client's labels, within the runtime's bounds (`kernelgw.runtime.lease`) less the
    face's own entries; no key of the face's (`RESERVED_PREFIX`)."""
    if len(metadata) > MAX_METADATA_ITEMS:
        raise ValueError(f"{len(metadata)} metadata entries; at most {MAX_METADATA_ITEMS} are accepted")
    for key, value in metadata.items():
        if not key or len(key) > MAX_METADATA_KEY:
            raise ValueError(f"metadata key {key[:80]!r} must have 1 to {MAX_METADATA_KEY} characters")
        if len(value) > MAX_METADATA_VALUE:
            raise ValueError(f"metadata value of {key[:80]!r} is longer than {MAX_METADATA_VALUE} characters")
        if key.startswith(RESERVED_PREFIX):
            raise ValueError(f"metadata key {key[:80]!r}: keys starting with {RESERVED_PREFIX!r} are kernelgw's own")
        if "\x00" in key or "\x00" in value:
            raise ValueError(f"metadata entry {key[:80]!r} holds a NUL character")
    return metadata


Timeout = Annotated[StrictInt, Field(ge=0)]
"""Seconds from now until the sandbox ends (or pauses): the lease (the gateway's
``max_lease_s`` bounds it; the runtime checks)."""


class _Request(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


def unknown_fields(body: BaseModel) -> list[str]:
    """The fields of a request this face does not know (kept by ``extra="allow"``)."""
    return sorted(body.model_extra or {})


# ---------------------------------------------------------------- requests
class AutoResume(_Request):
    enabled: StrictBool


class NetworkConfig(_Request):
    """``SandboxNetworkConfig``: every field but the ones that keep a sandbox
    closed asks for something a network-less sandbox cannot give."""

    allow_public_traffic: StrictBool | None = Field(None, alias="allowPublicTraffic")
    allow_out: list[StrictStr] | None = Field(None, alias="allowOut")
    deny_out: list[StrictStr] | None = Field(None, alias="denyOut")
    dns_servers: list[StrictStr] | None = Field(None, alias="dnsServers")
    egress_proxy: dict[str, Any] | None = Field(None, alias="egressProxy")
    mask_request_host: StrictStr | None = Field(None, alias="maskRequestHost")
    https_ports: list[StrictInt] | None = Field(None, alias="httpsPorts")
    rules: dict[str, Any] | None = None


class NetworkUpdate(_Request):
    """``SandboxNetworkUpdateConfig`` (``PUT /sandboxes/{id}/network``)."""

    allow_out: list[StrictStr] | None = Field(None, alias="allowOut")
    deny_out: list[StrictStr] | None = Field(None, alias="denyOut")
    dns_servers: list[StrictStr] | None = Field(None, alias="dnsServers")
    egress_proxy: dict[str, Any] | None = Field(None, alias="egressProxy")
    rules: dict[str, Any] | None = None
    allow_internet_access: StrictBool | None = None


class NewSandbox(_Request):
    """``NewSandbox`` (``POST /v2/sandboxes`` and ``POST /sandboxes``)."""

    template_id: StrictStr = Field(alias="templateID", min_length=1, max_length=512)
    timeout: Timeout = 300
    auto_pause: StrictBool = Field(False, alias="autoPause")
    auto_pause_memory: StrictBool = Field(True, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(None, alias="autoResume")
    secure: StrictBool | None = None
    allow_internet_access: StrictBool | None = None
    network: NetworkConfig | None = None
    metadata: Annotated[dict[StrictStr, StrictStr], AfterValidator(check_metadata)] | None = None
    env_vars: dict[StrictStr, StrictStr] | None = Field(None, alias="envVars")
    mcp: dict[str, Any] | None = None
    iam: dict[str, Any] | None = None
    volume_mounts: list[Any] | None = Field(None, alias="volumeMounts")


class NewSandboxV1(NewSandbox):
    """The older create (``POST /sandboxes``): E2B's default lease there is 15 s."""

    timeout: Timeout = 15


class TimeoutRequest(_Request):
    timeout: StrictInt
    """0 ends the sandbox now (or pauses it, with autoPause), as its timeout
    running out would; E2B takes a negative timeout as 0."""

    @field_validator("timeout")
    @classmethod
    def _negative_is_now(cls, value: int) -> int:
        return max(value, 0)


class ConnectRequest(_Request):
    """``ConnectSandbox``: a paused sandbox is resumed; a running one's lease is only extended."""

    timeout: Timeout = 300
    memory: StrictBool | None = None


class ResumeRequest(_Request):
    """``ResumedSandbox`` (the older ``POST /sandboxes/{id}/resume``)."""

    timeout: Timeout = 15
    auto_pause: StrictBool | None = Field(None, alias="autoPause")
    memory: StrictBool | None = None


class PauseRequest(_Request):
    memory: StrictBool | None = None
    require_healthy_guest: StrictBool | None = Field(None, alias="requireHealthyGuest")


class RefreshRequest(_Request):
    duration: StrictInt | None = Field(None, ge=0, le=3600)


class ForkRequest(_Request):
    timeout: Timeout = 15
    count: StrictInt = Field(1, ge=1, le=100)


class SnapshotRequest(_Request):
    name: StrictStr | None = None
    memory: StrictBool | None = None


# ---------------------------------------------------------------- answers
class _Answer(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class SandboxMetric(_Answer):
    """One reading of a sandbox's use (``SandboxMetric``): CPU of its quota, bytes."""

    timestamp: datetime
    timestamp_unix: int = Field(alias="timestampUnix")
    cpu_count: int = Field(alias="cpuCount")
    cpu_used_pct: float = Field(alias="cpuUsedPct")
    mem_used: int = Field(alias="memUsed")
    mem_total: int = Field(alias="memTotal")
    mem_cache: int = Field(alias="memCache")
    disk_used: int = Field(alias="diskUsed")
    disk_total: int = Field(alias="diskTotal")


class CreatedSandbox(_Answer):
    """``Sandbox``: what create, connect and resume answer."""

    template_id: str = Field(alias="templateID")
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(CLIENT_ID, alias="clientID")
    envd_version: str = Field(ENVD_VERSION, alias="envdVersion")
    alias: str | None = None
    envd_access_token: str | None = Field(None, alias="envdAccessToken")
    traffic_access_token: str | None = Field(None, alias="trafficAccessToken")
    """The same token: the code interpreter's context calls carry only this one."""


class Lifecycle(_Answer):
    auto_resume: bool = Field(alias="autoResume")
    on_timeout: Literal["kill", "pause"] = Field(alias="onTimeout")


class Network(_Answer):
    allow_public_traffic: bool = Field(False, alias="allowPublicTraffic")
    deny_out: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"], alias="denyOut")


class ListedSandbox(_Answer):
    template_id: str = Field(alias="templateID")
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(CLIENT_ID, alias="clientID")
    alias: str | None = None
    started_at: datetime = Field(alias="startedAt")
    end_at: datetime = Field(alias="endAt")
    cpu_count: int = Field(alias="cpuCount")
    memory_mb: int = Field(alias="memoryMB")
    disk_size_mb: int = Field(alias="diskSizeMB")
    state: Literal["running", "paused"]
    envd_version: str = Field(ENVD_VERSION, alias="envdVersion")
    metadata: dict[str, str] = Field(default_factory=dict)


class SandboxDetail(ListedSandbox):
    """``SandboxDetail``: the listed fields and the sandbox's settings. The access
    token is not in it: only create and connect give it out."""

    allow_internet_access: bool = Field(False, alias="allowInternetAccess")
    network: Network = Field(default_factory=Network)
    lifecycle: Lifecycle
    pause_mode: Literal["full"] | None = Field(None, alias="pauseMode")


class ForkResult(_Answer):
    sandbox: CreatedSandbox | None = None
    error: dict[str, Any] | None = None


class SnapshotInfo(_Answer):
    snapshot_id: str = Field(alias="snapshotID")
    names: list[str] = Field(default_factory=list)
