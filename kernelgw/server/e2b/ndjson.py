"""kernelgw's execution events as E2B's code-interpreter NDJSON (pure: no I/O).

E2B's ``POST /execute`` answers with one JSON object a line, which its SDKs read
with ``parse_output`` (e2b_code_interpreter/models.py)::

    {"type": "stdout" | "stderr", "text": ..., "timestamp": ...}
    {"type": "result", "text": ..., "html": ..., ..., "extra": {...}, "is_main_result": bool}
    {"type": "error", "name": ..., "value": ..., "traceback": "one string"}
    {"type": "number_of_executions", "execution_count": n}
    {"type": "end_of_execution"}        (always the last line)
    {"type": "keepalive"}               (while nothing else comes: the SDK skips it)

The shapes follow E2B's own server (e2b-dev/code-interpreter, template/server):
MIME types go to named fields (kernelgw's chart and data types to ``chart``
and ``data``) and the rest to ``extra``; ``text/plain`` loses
one pair of enclosing quotes (``'a'`` reads ``a``, as E2B's SDK users expect);
a traceback is the kernel's lines joined with nothing between them; ``None``
fields are left out. An ``update_display`` and a ``clear_output`` have no E2B
form (E2B drops them too).

What kernelgw itself decides about a cell reaches the SDK as an error, the last
one wins in the SDK: output over the caps (`OUTPUT_TRUNCATED`), a timeout
(`EXECUTION_TIMEOUT`), the kernel's death (`OUT_OF_MEMORY`, `KERNEL_DIED`), an
interrupt from elsewhere (`EXECUTION_INTERRUPTED`), and a stream cut short by
the gateway (`UNEXPECTED_END`, E2B's name for it). Each carries kernelgw's
reason as its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelgw import events as ev

OUTPUT_TRUNCATED = "OutputLimitExceeded"
EXECUTION_TIMEOUT = "ExecutionTimeout"
EXECUTION_INTERRUPTED = "ExecutionInterrupted"
OUT_OF_MEMORY = "OutOfMemory"
KERNEL_DIED = "KernelDied"
EXECUTION_FAILED = "ExecutionError"
UNEXPECTED_END = "UnexpectedEndOfExecution"

MIME_FIELDS: dict[str, str] = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    ev.DATA_MIME: "data",
    ev.CHART_MIME: "chart",
    "e2b/data": "data",
    "e2b/chart": "chart",
}
"""A result's MIME types and the field E2B's SDK reads each from; others go to ``extra``.
kernelgw's Python kernel gives a DataFrame's data and a figure's chart as E2B's
(`kernelgw.events.DATA_MIME`, `CHART_MIME`); a kernel with E2B's own formatters
gives them as ``e2b/data`` and ``e2b/chart``."""


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def line(self) -> str:
        """The object as one NDJSON line (``None`` fields left out, as E2B's server does)."""
        return self.model_dump_json(exclude_none=True, by_alias=True) + "\n"


class Stdout(_Line):
    type: Literal["stdout"] = "stdout"
    text: str
    timestamp: str
    """ISO 8601, when the gateway passed the output on (E2B: the kernel's message date)."""


class Stderr(_Line):
    type: Literal["stderr"] = "stderr"
    text: str
    timestamp: str


class Result(_Line):
    """A display (``is_main_result`` false) or the cell's value (true)."""

    type: Literal["result"] = "result"
    text: Any = None
    html: Any = None
    markdown: Any = None
    svg: Any = None
    png: Any = None
    jpeg: Any = None
    pdf: Any = None
    latex: Any = None
    json_: Any = Field(None, alias="json")
    """``application/json`` (``json`` on the wire; pydantic's models have a ``json``)."""
    javascript: Any = None
    data: Any = None
    chart: Any = None
    extra: dict[str, Any]
    is_main_result: bool


class Error(_Line):
    type: Literal["error"] = "error"
    name: str
    value: str
    traceback: str


class NumberOfExecutions(_Line):
    type: Literal["number_of_executions"] = "number_of_executions"
    execution_count: int


class EndOfExecution(_Line):
    type: Literal["end_of_execution"] = "end_of_execution"


KEEPALIVE = '{"type":"keepalive"}\n'
"""Sent while a cell is silent: a write is how a server finds a client gone for good."""


def _unquoted(text: Any) -> Any:
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def result(data: ev.MimeBundle, *, main: bool) -> Result:
    """A bundle as E2B's result: known MIME types in their fields, the rest in ``extra``."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        name = MIME_FIELDS.get(mime)
        if name is None:
            extra[mime] = value
        else:
            fields[name] = value
    if "text" in fields:
        fields["text"] = _unquoted(fields["text"])
    return Result(**fields, extra=extra, is_main_result=main)


def kernel_error(event: ev.Error) -> Error:
    return Error(name=event.ename, value=event.evalue, traceback="".join(event.traceback))


def gateway_error(name: str, value: str) -> Error:
    """An error kernelgw reports about the cell (no traceback: it did not raise)."""
    return Error(name=name, value=value, traceback="")


def verdict(done: ev.Done, error_sent: bool) -> Error | None:
    """What the SDK must be told of how the gateway ended the cell, if anything:
    an ``ok`` cell nothing, an ``error`` cell its kernel's error (sent already,
    else the gateway's reason), the rest the gateway's verdict."""
    reason = done.reason or f"the execution ended with status {done.status}"
    if done.status == "ok" or (done.status == "error" and error_sent):
        return None
    if done.status == "error":
        return gateway_error(EXECUTION_FAILED, reason)
    if done.status == "timeout":
        return gateway_error(EXECUTION_TIMEOUT, reason)
    if done.status == "interrupted":
        return gateway_error(EXECUTION_INTERRUPTED, reason)
    return gateway_error(OUT_OF_MEMORY if reason.startswith("out-of-memory") else KERNEL_DIED, reason)


@dataclass
class Translation:
    """One execution's events as E2B's lines, in order (`feed`), ending once (`end`)."""

    error_sent: bool = False
    execution_count: int | None = None
    ended: bool = False

    def feed(self, event: ev.Event, now: datetime) -> list[str]:
        """The lines for one of the execution's events (``now``: when it is passed on)."""
        if self.ended:
            return []
        if isinstance(event, ev.Stream):
            stream = Stdout if event.name == "stdout" else Stderr
            return [stream(text=event.text, timestamp=now.isoformat()).line()]
        if isinstance(event, ev.Display):
            return [result(event.data, main=False).line()]
        if isinstance(event, ev.Result):
            if event.execution_count is not None:
                self.execution_count = event.execution_count
            return [result(event.data, main=True).line()]
        if isinstance(event, ev.Error):
            self.error_sent = True
            return [kernel_error(event).line()]
        if isinstance(event, ev.Truncated):
            return [gateway_error(OUTPUT_TRUNCATED, event.message).line()]
        if isinstance(event, ev.Done):
            return self._done(event)
        return []  # queued, status, replay, update_display, clear_output, late, ...

    def _done(self, done: ev.Done) -> list[str]:
        lines = []
        if (error := verdict(done, self.error_sent)) is not None:
            lines.append(error.line())
        count = done.execution_count if done.execution_count is not None else self.execution_count
        if count is not None:
            lines.append(NumberOfExecutions(execution_count=count).line())
        lines.append(EndOfExecution().line())
        self.ended = True
        return lines

    def cut_short(self, why: str) -> list[str]:
        """The end of a stream that stops before the cell's ``done`` (E2B's
        unexpected end: an error, then the end line)."""
        if self.ended:
            return []
        self.ended = True
        return [gateway_error(UNEXPECTED_END, why).line(), EndOfExecution().line()]
