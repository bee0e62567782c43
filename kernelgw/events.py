"""The wire events: kernelgw's public contract, defined once.

REST (`POST /execute`), the WebSocket and the SDK all speak these shapes. One
execution produces, in order::

    queued -> [replay] -> status(busy) -> (stream | display | update_display
              | result | clear_output | error | truncated)* -> done -> late*

`done` is sent exactly once and is the last event of an execution, except for
``late``: output the kernel sent for the execution after its end, kept and
sent wrapped (`Late`). Every
event that belongs to an execution names its ``execution_id``; every event a
session publishes carries a per-session ``seq`` (monotonic, starting at 1) so a
WebSocket client can resume after a reconnect. ``gap`` and ``protocol_error``
belong to a connection, not to an execution.

Recovery by replay re-runs a session's cells in a fresh kernel: a ``replay``
event (``phase: started``, no execution) opens it, each replayed execution
carries one (``phase: cell``, right after its ``queued``, naming the execution
it re-runs in ``replay_of``), and one (``phase: finished``) closes it.

The kernel-output shapes map one to one onto nbformat v4 output types
(stream, display_data, execute_result, error), which keeps notebook export exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationInfo, model_validator

MimeBundle = dict[str, Any]
"""MIME type -> data, exactly as the kernel sent it (``image/png`` stays base64)."""

CHART_MIME = "application/vnd.kernelgw.chart+json"
"""In a display's or result's bundle: the structured chart of a figure (the Python
kernel adds it to matplotlib figures): ``{"type", "title", "elements", ...}``, E2B's
chart. Its shape and bounds: images/python/kernelgw_kernel/displays.py; the SDK's
typed view: `kernelgw.client.execution.Chart`."""
DATA_MIME = "application/vnd.kernelgw.data+json"
"""In a display's or result's bundle: a table's data as ``{"column": [values]}``
(the Python kernel adds it to pandas DataFrames of up to 10,000 cells; E2B's data)."""

DoneStatus = Literal["ok", "error", "timeout", "interrupted", "dead"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def _container_has_surrogate(value: dict[Any, Any] | list[Any]) -> bool:
    stack: list[dict[Any, Any] | list[Any]] = [value]
    while stack:
        node = stack.pop()
        for item in (*node.keys(), *node.values()) if isinstance(node, dict) else node:
            if isinstance(item, str):
                if _has_surrogate(item):
                    return True
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return False


def holds_surrogate(value: Any) -> bool:
    """Whether a string, or dicts and lists of them (keys too), holds a surrogate
    code point: text no UTF-8 encoder takes."""
    if isinstance(value, str):
        return _has_surrogate(value)
    return isinstance(value, (dict, list)) and _container_has_surrogate(value)


def without_surrogates(value: Any) -> Any:
    """``value`` (a string, or dicts and lists of them, as decoded JSON) with
    every surrogate code point replaced by U+FFFD; the very same object when it
    holds none. A Python string may hold a lone surrogate (a kernel's JSON can
    carry ``"\\ud800"``), which no UTF-8 encoder takes: an event with one could
    be neither sent nor stored. Iterative: nesting depth does not matter."""
    if not holds_surrogate(value):
        return value
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)

    def fix(item: Any) -> Any:
        return _SURROGATE.sub("\ufffd", item) if isinstance(item, str) and _has_surrogate(item) else item

    root: dict[Any, Any] | list[Any] = {} if isinstance(value, dict) else [None] * len(value)
    stack: list[tuple[dict[Any, Any] | list[Any], dict[Any, Any] | list[Any]]] = [(value, root)]
    while stack:
        source, copy = stack.pop()
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in pairs:
            if isinstance(item, (dict, list)):
                new: Any = {} if isinstance(item, dict) else [None] * len(item)
                stack.append((item, new))
            else:
                new = fix(item)
            if isinstance(copy, dict):
                copy[fix(key)] = new
            else:
                copy[key] = new
    return root


TEXT_CHECKED: dict[str, Any] = {"text_checked": True}
"""The validation context (``Model.model_validate(data, context=TEXT_CHECKED)``,
this very object) of data known to hold no surrogate: decoded by orjson, which
refuses JSON with a lone surrogate, and only cut or joined since. Models skip
their walk of every string then (a few us an event, on every kernel message)."""


class _Text(BaseModel):
    """Every string a model holds is valid Unicode text (encodable as UTF-8)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_surrogates(cls, data: Any, info: ValidationInfo) -> Any:
        if info.context is TEXT_CHECKED:
            return data
        return without_surrogates(data)


class _Event(_Text):
    seq: int | None = None
    """Per-session sequence number, set when the session publishes the event."""
    execution_id: str | None = None


class Queued(_Event):
    """The gateway accepted an execution; lets every watcher show the code."""

    type: Literal["queued"] = "queued"
    code: str
    position: int = 0
    """How many executions are ahead of this one in the session's queue."""


class Status(_Event):
    type: Literal["status"] = "status"
    state: Literal["busy", "idle"]


class Stream(_Event):
    type: Literal["stream"] = "stream"
    name: Literal["stdout", "stderr"]
    text: str


class Display(_Event):
    type: Literal["display"] = "display"
    data: MimeBundle
    metadata: dict[str, Any] = Field(default_factory=dict)
    display_id: str | None = None


class UpdateDisplay(_Event):
    """Replaces the data of an earlier display with the same ``display_id``."""

    type: Literal["update_display"] = "update_display"
    data: MimeBundle
    metadata: dict[str, Any] = Field(default_factory=dict)
    display_id: str


class Result(_Event):
    """The value of the cell's last expression (nbformat ``execute_result``)."""

    type: Literal["result"] = "result"
    execution_count: int | None = None
    data: MimeBundle
    metadata: dict[str, Any] = Field(default_factory=dict)


class ClearOutput(_Event):
    type: Literal["clear_output"] = "clear_output"
    wait: bool = False


class Error(_Event):
    """An exception raised by user code."""

    type: Literal["error"] = "error"
    ename: str
    evalue: str
    traceback: list[str]
    """Traceback lines as the kernel sent them, with ANSI colour codes."""
    traceback_text: list[str]
    """The same lines with ANSI codes removed, for models and logs."""


class Truncated(_Event):
    """Output past the per-execution cap was dropped; the kernel kept running."""

    type: Literal["truncated"] = "truncated"
    limit_bytes: int
    message: str


class Artifact(_Text):
    """A workspace file the execution created or changed."""

    path: str
    """Relative to the workspace (the kernel's working directory)."""
    size: int
    mime_type: str
    change: Literal["created", "modified"]


class Done(_Event):
    type: Literal["done"] = "done"
    status: DoneStatus
    execution_count: int | None = None
    duration_ms: float
    reason: str | None = None
    """Why the status is not ``ok``, in words a person or a model can act on."""
    state_lost: bool = False
    """True when the kernel was restarted, so earlier variables are gone."""
    artifacts: list[Artifact] = Field(default_factory=list)
    """Workspace files this execution created or changed (for UIs to offer)."""


LateOutput = Annotated[Stream | Display | UpdateDisplay | Result | Error | Truncated, Field(discriminator="type")]
"""What a cell may still add to its record after its ``done`` (`Late`)."""


class Late(_Event):
    """Output of an execution that came after its ``done``.

    A cell's code holds its kernel's key and can end its cell early as a REST
    caller sees it (`kernelgw.runtime.message_routes`). What it sends after that
    is not dropped: it is appended to the execution's record (history, notebook,
    audit; an ``error`` turns the recorded status to ``error``), within the same
    output cap, and then sent wrapped in this event, so a client that stopped at
    ``done`` is not misled and one that watches sees it. The wrapped event names
    the same execution and carries no ``seq`` of its own."""

    type: Literal["late"] = "late"
    event: LateOutput


ReplayTrigger = Literal["requested", "kernel_died", "timeout", "fork", "resume"]


class Replay(_Event):
    """Recovery by replay: the session re-runs its cells in a fresh kernel.

    ``started`` and ``finished`` bracket the replay (no ``execution_id``);
    ``cell`` belongs to one replayed execution, right after its ``queued``."""

    type: Literal["replay"] = "replay"
    phase: Literal["started", "cell", "finished"]
    trigger: ReplayTrigger
    """``requested`` (a restart asked for it), or ``auto_replay`` after the kernel
    ``kernel_died`` (out of memory, most often) or was restarted after a ``timeout``,
    or ``fork`` (a new session rebuilds the state of the one it was forked from), or
    ``resume`` (a paused session asked to rebuild what its snapshot could not hold)."""
    cells: int
    """How many cells the replay runs."""
    index: int | None = None
    """cell: its place in the replay, from 0."""
    replay_of: str | None = None
    """cell: the execution it re-runs."""
    replayed: int | None = None
    """finished: how many cells ran ``ok`` (the replay stops at the first that did not)."""
    duration_ms: float | None = None
    """finished: how long the replay took."""


class Gap(_Event):
    """A resuming client asked for events older than the replay buffer holds."""

    type: Literal["gap"] = "gap"
    first_missing: int
    last_missing: int


class ProtocolError(_Event):
    """A client message could not be handled; the connection stays open."""

    type: Literal["protocol_error"] = "protocol_error"
    message: str


Event = Annotated[
    Queued
    | Status
    | Stream
    | Display
    | UpdateDisplay
    | Result
    | ClearOutput
    | Error
    | Truncated
    | Done
    | Late
    | Replay
    | Gap
    | ProtocolError,
    Field(discriminator="type"),
]

EVENT_TYPES: frozenset[str] = frozenset(model.model_fields["type"].default for model in get_args(get_args(Event)[0]))
"""Every event ``type`` this version knows; a client meets newer ones from newer gateways."""

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_LIST_ADAPTER: TypeAdapter[list[Event]] = TypeAdapter(list[Event])


def parse_event(data: str | bytes | dict[str, Any]) -> Event:
    """Parse one event from JSON text or a decoded dict (used by the SDK)."""
    if isinstance(data, dict):
        return EVENT_ADAPTER.validate_python(data)
    return EVENT_ADAPTER.validate_json(data)


def json_array(items: Iterable[str]) -> str:
    """Serialised JSON values as one JSON array, copied once: a cell's events
    are spliced into its row as published, and may be megabytes long."""
    parts = ["["]
    for item in items:
        parts += (item, ",")
    if len(parts) > 1:
        parts[-1] = "]"
    else:
        parts.append("]")
    return "".join(parts)
