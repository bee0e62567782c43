"""Gateway settings, from ``KERNELGW_*`` environment variables or a config file.

Created once in the app's lifespan and kept on ``app.state``; nothing reads the
environment at import time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from kernelgw.kernels import DEFAULT_KERNEL, profile

DEFAULT_IMAGE = "kernelgw/python:latest"


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "kernelgw"


def parse_uid_range(text: str) -> range:
    """``"START-END"`` (both included) as a range; ValueError saying why not."""
    start_text, sep, end_text = text.strip().partition("-")
    if not sep:
        raise ValueError(f"kernel_uid_range must be START-END (for example 200000-265535); got {text!r}")
    try:
        start, end = int(start_text), int(end_text)
    except ValueError:
        raise ValueError(f"kernel_uid_range must be two whole numbers, START-END; got {text!r}") from None
    if start < 1000:
        raise ValueError(f"kernel_uid_range must start at 1000 or above (below are system accounts); got {text!r}")
    if end < start:
        raise ValueError(f"kernel_uid_range ends before it starts: {text!r}")
    if end > 2**31 - 2:
        raise ValueError(f"kernel_uid_range must end at or below {2**31 - 2}; got {text!r}")
    return range(start, end + 1)


class PoolProfileSettings(BaseModel):
    """A warm pool for sessions asking for exactly these values (None: the default)."""

    model_config = ConfigDict(extra="forbid")

    kernel: str | None = None
    """A kernel of ``kernels`` (e.g. ``"ruby"``): its sessions start warm too."""
    image: str | None = None
    memory_mb: int | None = None
    cpus: float | None = None
    runtime: Literal["runc", "runsc"] | None = None
    size: int = Field(1, ge=0)
    """Kernels this pool keeps warm."""
    max_size: int | None = Field(None, ge=0)


DEFAULT_KERNEL_UID = 61000
DEFAULT_KERNEL_UID_RANGE = "200000-265535"
"""A block no host account has (Debian gives users 1000-59999, subuids start at 100000
in blocks of 65536; choose one free of them on your host)."""
"""Above the regular accounts (1000-60000) and below systemd's dynamic users
(61184-65519): no host account has it on a usual Linux host."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNELGW_", extra="forbid")

    # --- network of the gateway itself
    host: str = "127.0.0.1"
    """The address the gateway listens on (``kernelgw serve --host``). Without API keys it refuses anything but loopback (``allow_remote_without_auth``)."""
    port: int = 8000
    """The TCP port the gateway listens on (``kernelgw serve --port``)."""
    header_timeout_s: float = Field(10.0, gt=0)
    """Time a connection has to send a request's complete headers (from opening, or
    from its previous response) before it is closed: slow-header clients cannot
    hold connections open."""
    keepalive_timeout_s: float = Field(8.0, gt=0)
    """An idle keep-alive connection is closed after this long without a byte.
    Longer than the idle expiry of common clients (httpx, which the SDK and E2B's
    SDK use, and Node's agents: 5 s), so they drop a connection before the
    gateway does: at 5 s against httpx's 5 s, a request sent on a connection at
    the moment the gateway closed it failed with "Server disconnected without
    sending a response" (seen in CI). Below ``header_timeout_s``, so an idle
    connection ends here, quietly."""
    workers: int = Field(1, ge=1, le=64)
    """Gateway processes serving the one ``host:port`` together (``kernelgw serve
    --workers N``; about one per core): each owns the sessions it creates and
    forwards requests for its siblings' sessions to them (``kernelgw.server.workers``).
    1: one process, as without the option. Per worker: ``pool_size``,
    ``max_sessions``, ``executions_per_minute``, ``/metrics``."""

    # --- security: authentication, quotas, caps, audit, code policy
    auth: Literal["auto", "required", "off"] = "auto"
    """``auto``: API keys are required as soon as one exists (revoked ones count);
    ``required``: always (no key, no access); ``off``: never."""
    allow_remote_without_auth: bool = False
    """A gateway without authentication refuses to listen on anything but loopback
    unless this is set (``kernelgw serve --insecure-allow-remote``)."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Web origins (``https://chat.example.com``) besides the gateway's own whose pages
    may call the gateway and open its WebSockets; ``"*"`` allows any. Clients that
    send no Origin (SDKs, agents) are not affected."""
    allowed_hosts: list[str] | None = None
    """Names the gateway answers to in the ``Host`` header, against DNS rebinding (a
    web page whose own name resolves to this address). IP addresses are always
    accepted; ``*.example.com`` matches subdomains; ``"*"`` turns the check off.
    None: ``localhost`` (and ``*.localhost``), this machine's host name, and the
    listen address when it is a name. Behind a load balancer or under a DNS name,
    list the names clients use."""
    trusted_proxies: list[str] = Field(default_factory=list)
    """Addresses or CIDR networks of the proxies in front of the gateway whose
    ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed (the client address
    in logs). Empty: nobody's, loopback included; a peer gateway's forward with a
    valid proof is believed anyway."""
    auth_cache_s: float = Field(2.0, ge=0)
    """How long a looked-up key is trusted before the database is asked again: a
    key revoked from the CLI stops working within this time."""
    browser_token_ttl_s: float = Field(300.0, gt=0)
    """Lifetime of the short-lived tokens browsers use on WebSocket URLs."""
    token_secret: SecretStr | None = None
    """Signs browser tokens. None: a random secret per process (tokens die with
    it); give replicas behind one load balancer the same value."""
    max_sessions_per_key: int | None = Field(None, gt=0)
    """Sessions one key may hold at once (a key's own quota wins); None: only ``max_sessions``."""
    executions_per_minute: int | None = Field(None, gt=0)
    """Executions one key may start per minute (a key's own quota wins); None: unlimited."""
    max_message_bytes: int = Field(64 * 1024 * 1024, gt=0)
    """Largest single message frame accepted from a kernel (ZMQ_MAXMSGSIZE): a kernel
    that sends more is cut off for that message and the execution gets ``truncated``."""
    max_image_bytes: int = Field(8 * 1024 * 1024, gt=0)
    """Largest image (its base64 text) one display may carry; bigger ones are replaced
    by a note and a ``truncated`` event."""
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0)
    """Largest HTTP request body, file uploads excepted (they have ``max_upload_bytes``)."""
    max_ws_message_bytes: int | None = Field(None, gt=0)
    """Largest WebSocket frame a client may send; None: ``max_code_bytes`` + 64 KiB."""
    audit_retention_days: float = Field(365.0, ge=0)
    """Audit records (executions, lifecycle events, key changes) are kept this long."""
    policy_deny_imports: list[str] = Field(default_factory=list)
    """Static code policy (defence in depth; off when all three are empty): modules a
    cell may not import, e.g. ``["subprocess", "ctypes"]``."""
    policy_deny_calls: list[str] = Field(default_factory=list)
    """Calls a cell may not make, e.g. ``["os.system", "eval"]``."""
    policy_deny_shell: bool = False
    """Refuse IPython shell escapes (``!cmd``, ``%%bash``, ``%system``)."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """The gateway's own logs on stderr: JSON lines, or text for people; ``auto``:
    text when stderr is a terminal, JSON lines otherwise."""

    @property
    def ws_max_message_bytes(self) -> int:
        return self.max_ws_message_bytes or self.max_code_bytes + 64 * 1024

    # --- identity: containers carry this name as a label; a gateway removes the
    # containers of its own name left by a crashed predecessor when it starts.
    gateway_name: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    """Letters, digits, ``_``, ``.`` and ``-``: it is part of the names of the engine's
    containers and volumes (which refuse others) and of the instance lock's file."""

    # --- many gateways as one service (kernelgw.cluster): on when cluster_secret is set
    cluster_secret: SecretStr | None = None
    """Shared by every gateway of one service (same PostgreSQL): proves a forwarded
    request came from a peer gateway. Setting it turns the cluster on: this gateway
    heartbeats into the store's gateway registry, forwards requests for sessions
    other live gateways own, and lists theirs. None: a gateway on its own."""
    advertise_url: str | None = None
    """Where peer gateways reach this one (``http://10.0.0.5:8000``). None:
    derived from the listen address (this host's name when it listens on all
    addresses). Its host must be an IP address or a name in ``allowed_hosts``."""
    placement: Literal["local", "load"] = "local"
    """Where a new session's kernel runs: ``local``, on the gateway that got the
    request (the load balancer spreads them); ``load``, on the live gateway with
    the fewest running sessions, then the most free memory (the create is
    forwarded there)."""
    cluster_peers: list[str] | None = None
    """The only gateways of the store this one treats as its cluster (None: all).
    ``kernelgw serve --workers`` sets it to its workers' names when no
    ``cluster_secret`` is given: another host's gateways sharing the database
    are not theirs to list or forward to."""
    cluster_heartbeat_s: float = Field(3.0, gt=0)
    """How often a gateway writes its heartbeat and load into the registry."""
    cluster_gone_after_s: float = Field(15.0, gt=0)
    """A gateway whose heartbeat is older than this is gone: its sessions answer
    503 naming it until it comes back. Keep it several heartbeats long, and
    the gateways' clocks in step (NTP)."""

    # --- kernels
    image: str = DEFAULT_IMAGE
    """The kernel image of a session that names none (``kernelgw image build`` makes it)."""
    allowed_images: list[str] = Field(default_factory=list)
    """Images a session may ask for besides ``image``; empty means only ``image``."""
    kernels: list[str] = Field(default_factory=lambda: [DEFAULT_KERNEL])
    """The kernels sessions may ask for (``{"kernel": "deno"}``), by kernelspec name:
    python3, deno, ir, bash, java, go, cpp, ruby. The first is the default. Their
    images are built at start when missing (``kernelgw image build --kernel NAME``)."""
    kernel_images: dict[str, str] = Field(default_factory=dict)
    """Image per kernel name where it is not ``kernelgw/<name>:latest`` (python3's
    is ``image``)."""
    runtime: Literal["runc", "runsc"] = "runc"
    """The container runtime of the kernels: ``runc``, or ``runsc`` for gVisor (``scripts/ensure-runsc.sh`` installs it)."""
    allowed_runtimes: list[Literal["runc", "runsc"]] = Field(default_factory=list)
    """Runtimes a session may ask for besides ``runtime`` (``{"runtime": "runsc"}``
    on create); empty means only ``runtime``."""
    runtime_dir: Path = Path("/tmp/kernelgw")
    """Per-session connection directories live here; keep the path short (unix
    socket paths must stay under 107 bytes)."""
    kernel_uid: int = Field(DEFAULT_KERNEL_UID, gt=0)
    """The uid kernels run as: one of no host account (1000 is the first user on
    most hosts), so nothing on the host is theirs. The image names it ``kernel``;
    the gateway warns at start if a host account has it."""
    kernel_gid: int = Field(DEFAULT_KERNEL_UID, gt=0)
    """The group id the kernels run as."""
    kernel_uid_range: str = DEFAULT_KERNEL_UID_RANGE
    """Host uids given to sessions, ``START-END`` (both included): each session's
    kernel runs as one of its own (group the same number), so nothing the Linux
    kernel counts per uid (inotify instances, message queues, processes) is shared
    between sessions. Unique across every gateway on the host (they agree through
    the engine's labels and a lock in ``uid_state_dir``); a uid is free again once
    its session's containers are gone. Empty: every kernel runs as ``kernel_uid``,
    sharing those limits. A gateway not running as root runs every kernel as its
    own uid, whatever this says (it cannot give files to another)."""
    uid_state_dir: Path = Path("/run/kernelgw/.uids")
    """Where the gateways of one host keep the lock and reservations of
    ``kernel_uid_range``: the same directory for all of them. The gateway image
    puts it in its runtime directory (bind-mounted from the host, which is
    ``/run/kernelgw`` by default, so host and container gateways share it)."""

    # --- limits: defaults for a session, and the most a session may ask for
    memory_mb: int = 2048
    """tmpfs pages (/tmp, /workspace, packages, shm) count against this limit."""
    max_memory_mb: int = 4096
    """The most memory (MiB) a session may ask for with ``memory_mb``."""
    cpus: float = 1.0
    """CPUs a session gets when it asks for none."""
    max_cpus: float = 2.0
    """The most CPUs a session may ask for."""
    pids_limit: int = 256
    """Processes and threads a kernel's container may hold at once."""
    tmp_size_mb: int = 128
    """Size of each session's ``/tmp`` (tmpfs)."""
    workspace_size_mb: int = 512
    """Size of each session's ``/workspace`` (tmpfs), the kernel's working directory."""
    shm_size_mb: int = 64
    """Size of each session's ``/dev/shm``."""

    # --- sessions
    max_sessions: int = 50
    """Sessions this gateway process runs at once (per worker with ``workers``); past it new sessions get 429."""
    idle_timeout_s: float = 1800.0
    """A session with no execution and no WebSocket (or Jupyter channels) for this long is ended, or paused with ``idle_action=pause``."""
    idle_action: Literal["end", "pause"] = "end"
    """What happens to a session idle for ``idle_timeout_s`` with nobody watching:
    ``end`` it, or ``pause`` it (container freed, state kept on disk, resumed by
    its next request)."""
    snapshot_max_bytes: int = Field(4 * 1024**3, gt=0)
    """Most a paused session's pickled namespace may take; names past it are
    reported as not saved."""
    paused_budget_mb: int = Field(10240, gt=0)
    """Most this gateway's disk may hold of paused sessions' snapshots, together
    (in ``data_dir``/paused). A pause that would pass it is refused with 507 and
    the session goes on running. One snapshot is at most about the session's
    ``workspace_size_mb`` + ``packages_size_mb`` (sparse files count their data only)."""
    paused_ttl_s: float = Field(7 * 86400.0, ge=0)
    """A session paused for longer than this is ended (reason recorded in its
    history and the audit log) and its snapshot deleted; 0: paused sessions are
    kept until deleted. Checked every ``reap_interval_s``."""
    reap_interval_s: float = 30.0
    """How often idle sessions are looked for and reaped (ended, or paused with ``idle_action=pause``)."""
    max_lease_s: float = Field(86400.0, gt=0)
    """Longest lease (E2B's sandbox timeout) a session may be given at once, in
    seconds; it can be extended by that much again. A session under a lease ends
    (or pauses) when it runs out, within about a second, and is not reaped as idle
    before."""
    kernel_start_timeout_s: float = 60.0
    """How long a starting kernel has to answer (``kernel_info`` on shell and iopub) before its start fails."""
    on_shutdown: Literal["keep", "stop"] = "keep"
    """``keep``: a gateway that stops leaves its kernels running for the next one
    of its name, which reattaches them; ``stop``: it removes them."""
    reattach_timeout_s: float = 10.0
    """How long a restarted gateway waits for a left kernel's kernel_info reply."""

    # --- executions
    exec_timeout_s: float = 300.0
    """An execution's timeout when it asks for none: the cell is interrupted, and its kernel restarted if it ignores the interrupt."""
    max_exec_timeout_s: float = 3600.0
    """The longest timeout an execution or session may ask for."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long running cells have to finish before the gateway exits."""
    interrupt_grace_s: float = 5.0
    """After a timeout interrupt, how long the kernel has to become idle before it
    is restarted (and its state lost)."""
    max_output_bytes: int = 16 * 1024 * 1024
    """Per execution; output past it is dropped behind a ``truncated`` event."""
    max_code_bytes: int = 1024 * 1024
    """The largest cell accepted; larger ones get 413."""
    replay_buffer: int = 2000
    """Events kept per session for WebSocket clients that resume."""
    replay_buffer_bytes: int = 4 * 1024 * 1024
    """Bytes of event JSON kept per session for resuming clients; older events
    give way first (a resuming client then gets a ``gap`` event)."""
    subscriber_queue: int = 10000
    """Events buffered for one slow WebSocket client before it is dropped."""
    subscriber_max_bytes: int = 64 * 1024 * 1024
    """Bytes buffered for one slow WebSocket client before it is dropped."""
    state_poll_s: float = 0.5
    """How often a busy session asks the engine whether its container still runs."""

    # --- warm pool: kernels started ahead of demand
    pool_size: int = Field(2, ge=0)
    """Warm kernels kept ready for sessions with the default image and limits: a
    session is then a hand-over instead of a 0.5-1.4 s container start. An idle
    kernel holds about 60 MB. 0 turns the pool off."""
    pool_max_size: int | None = Field(None, ge=0)
    """How far the pool may grow under demand (misses); default twice ``pool_size``."""
    pool_shrink_after_s: float = Field(300.0, gt=0)
    """Without demand for this long, a grown pool shrinks back to its size."""
    pool_profiles: list[PoolProfileSettings] = Field(default_factory=list)
    """Further pools for other kernels, images or limits, e.g. ``[{"memory_mb": 4096, "size": 1}]``
    or ``[{"kernel": "deno", "size": 1}]``."""

    # --- history and storage (sessions, executions, notes; notebook export/restore)
    data_dir: Path = Field(default_factory=_default_data_dir)
    """The gateway's own files; the SQLite database ``kernelgw.db`` is created here
    on first start. Default ``$XDG_DATA_HOME/kernelgw`` (``~/.local/share/kernelgw``)."""
    database_url: str | None = None
    """``postgresql://user:pass@host/db`` (asyncpg) or ``sqlite:///path``; None means
    SQLite in ``data_dir``."""
    durability: Literal["process", "fsync"] = "process"
    """When a history commit counts as stored (and a cell is answered): "process"
    survives a crash of the gateway process (SQLite WAL, ``synchronous=NORMAL``),
    "fsync" also power loss (``synchronous=FULL``). PostgreSQL commits are durable."""
    history_retention_days: float = Field(30.0, ge=0)
    """History of a session is kept this long after the session ended."""
    history_purge_interval_s: float = Field(3600.0, ge=0)
    """How often expired history is deleted (also once soon after start); 0: only then."""

    # --- workspace files and offline packages
    max_upload_bytes: int = Field(256 * 1024 * 1024, gt=0)
    """Largest file one upload may write (413 beyond it)."""
    workspace_quota_bytes: int | None = Field(None, gt=0)
    """Most a session's workspace may hold; None: the size of its tmpfs
    (``workspace_size_mb``). An upload that would pass it gets 413."""
    persistent_workspace: bool = True
    """A session's workspace and installed packages outlive its kernel: a restart,
    a timeout's restart or an out-of-memory kill keeps them (runc kernels; see
    ``kernelgw.runtime.backends.docker``). Costs one sleeping container per session.
    False: they live and end in the kernel's container."""
    file_io_timeout_s: float = Field(120.0, gt=0)
    """How long a file transfer may stall (no byte moving) before it fails."""
    package_allowlist: list[str] = Field(default_factory=list)
    """What sessions may install (POST .../packages): names, each optionally with a
    version specifier (``"sympy"``, ``"tabulate>=0.9"``). Their dependencies come
    along. Empty: installing is off."""
    wheel_cache_dir: Path | None = None
    """Wheels for session installs, in ``<python>-<machine>/`` subdirectories (the
    image build's cache). None: ``$XDG_CACHE_HOME/kernelgw/wheels``. An offline
    gateway installs only what is here."""
    package_download: bool = True
    """Whether the gateway may download wheels missing from the cache (on the
    host, with pip; the sandbox never gets network)."""
    packages_size_mb: int = Field(256, gt=0)
    """Size of each session's package tmpfs (counts against its memory)."""
    package_install_timeout_s: float = Field(300.0, gt=0)
    """Resolving plus installing one request's packages; past it the install fails."""

    # --- E2B's API (/e2b)
    e2b_templates: dict[str, str] = Field(default_factory=dict)
    """E2B template ids a sandbox may be created from, besides ``code-interpreter-v1``
    and ``base`` (both: the default Python kernel and ``image``; unmapped,
    ``code-interpreter-v1`` runs ``kernelgw/code-interpreter:latest`` instead
    where the engine has it: every language of E2B's code interpreter, built by
    ``kernelgw image build --kernel code-interpreter``), each mapped to what it
    runs: a kernel name of ``kernels`` (``{"deno-v1": "deno"}``: that kernel's
    image) or an image of ``allowed_images`` (run with the Python kernel). An
    entry may also remap those two. Any other template id is E2B's 404."""
    e2b_root_commands: bool = False
    """Whether E2B's ``commands.run(..., user="root")`` (and ``pty``) may run as
    root in sandboxes under gVisor (``runsc``). Off: refused. Under runc, always
    refused: root in a runc container is the host's uid 0, which every tenant and
    the host share (docs/security.md, "Root in a sandbox"). On, the containers of
    runsc sessions also keep the file capabilities root needs to use the
    sandbox's files (the kernel drops them all)."""

    @field_validator("package_allowlist")
    @classmethod
    def _valid_allowlist(cls, v: list[str]) -> list[str]:
        from kernelgw.allowlist import parse_allowlist

        parse_allowlist(v)  # raises ValueError naming the bad entry
        return v

    @field_validator("kernels")
    @classmethod
    def _known_kernels(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError('kernels must name at least one kernel, e.g. ["python3"]')
        for name in v:
            profile(name)  # raises UnknownKernel (a ValueError) naming the known ones
        return list(dict.fromkeys(v))

    @field_validator("e2b_templates")
    @classmethod
    def _named_templates(cls, v: dict[str, str]) -> dict[str, str]:
        for template, target in v.items():
            if not template.strip() or not target.strip():
                raise ValueError(
                    f"e2b_templates entry {template!r}: {target!r} needs a template id and a kernel name or image"
                )
        return v

    @field_validator("kernel_images")
    @classmethod
    def _known_kernel_images(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            profile(name)
        return v

    def kernel_image(self, name: str) -> str:
        """The image sessions of kernel ``name`` run from."""
        if name == DEFAULT_KERNEL:
            return self.kernel_images.get(name, self.image)
        return self.kernel_images.get(name) or profile(name).image

    @property
    def cluster(self) -> bool:
        """Whether this gateway is one of many (``cluster_secret`` set)."""
        return self.cluster_secret is not None

    def own_url(self) -> str:
        """``advertise_url``, or one derived from the listen address."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            import socket

            host = socket.gethostname()  # a name PageGuard accepts by default (allowed_hosts)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def default_kernel(self) -> str:
        return self.kernels[0]

    @field_validator("advertise_url")
    @classmethod
    def _http_advertise_url(cls, v: str | None) -> str | None:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("advertise_url must be an http:// or https:// URL, e.g. http://10.0.0.5:8000")
        return v or None

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, v: str | None) -> str | None:
        if v and not v.startswith(("sqlite", "postgresql", "postgres")):
            raise ValueError("database_url must be a sqlite:// or postgresql:// URL")
        return v or None

    @field_validator("kernel_uid_range")
    @classmethod
    def _valid_uid_range(cls, v: str) -> str:
        if v.strip():
            parse_uid_range(v)  # raises ValueError saying what is wrong
        return v.strip()

    @field_validator("trusted_proxies")
    @classmethod
    def _valid_trusted_proxies(cls, v: list[str]) -> list[str]:
        import ipaddress

        for entry in v:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an IP address or a CIDR network (e.g. 10.0.0.5 or 10.0.0.0/8)"
                ) from None
        return [entry.strip() for entry in v]

    @field_validator("runtime_dir")
    @classmethod
    def _short_runtime_dir(cls, v: Path) -> Path:
        # <runtime_dir>/<12-char id>/k-<port> must fit in sun_path (108 bytes incl. NUL)
        if len(str(v)) > 80:
            raise ValueError(
                f"runtime_dir {str(v)!r} is too long for unix socket paths; use a path of at most 80 characters"
            )
        return v

    @model_validator(mode="after")
    def _defaults_within_maximums(self) -> Settings:
        if self.memory_mb > self.max_memory_mb:
            raise ValueError("memory_mb must not exceed max_memory_mb")
        if self.cpus > self.max_cpus:
            raise ValueError("cpus must not exceed max_cpus")
        if self.exec_timeout_s > self.max_exec_timeout_s:
            raise ValueError("exec_timeout_s must not exceed max_exec_timeout_s")
        if self.cluster_gone_after_s <= self.cluster_heartbeat_s:
            raise ValueError("cluster_gone_after_s must be longer than cluster_heartbeat_s")
        return self

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Settings:
        """Settings from a JSON/TOML file, then env vars, then explicit overrides.

        The three are merged before anything is validated: checks that relate two
        settings (``memory_mb`` within ``max_memory_mb``) must see the final values,
        not an env var against a default the file replaces.
        """
        data: dict[str, Any] = {}
        if config_file is not None:
            text = config_file.read_text()
            if config_file.suffix == ".toml":
                import tomllib

                data = tomllib.loads(text)
            else:
                data = json.loads(text)
        env = EnvSettingsSource(cls)()  # the KERNELGW_* env vars, decoded but not validated
        return cls(**{**data, **env, **overrides})
