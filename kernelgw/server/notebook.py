"""Session history <-> Jupyter notebook (nbformat v4). Pure: no I/O.

Export (`build_notebook`): one code cell per execution, in the order the session
ran them, its outputs rebuilt from the stored events exactly as a Jupyter
frontend would have saved them:

* consecutive ``stream`` events of the same name merge into one stream output;
* ``display`` -> ``display_data`` (metadata kept; the transient ``display_id``
  is not saved), ``result`` -> ``execute_result`` with its execution_count,
  ``error`` -> ``error`` with the traceback as the kernel sent it (ANSI codes
  included, as Jupyter stores it);
* ``update_display`` replaces data and metadata of every earlier output with
  that ``display_id``, in this cell or an earlier one;
* ``clear_output`` empties the cell's outputs so far; with ``wait=True`` only
  right before the cell's next output (so an animation keeps its last frame);
* ``truncated`` (the gateway's output cap) and a ``done`` of ``timeout`` or
  ``dead`` become a note on stderr, so a reader sees the cell did not finish;
* ``late`` (output sent after the cell's end) is added as its wrapped event,
  after a note on stderr saying so; but after an interim end (a cell a drain
  with ``on_shutdown=keep`` cut off, which the next gateway follows: `interim`)
  it is the cell's own output, added as such.

A cell's status, ``execution_count``, duration and reason are its row's
(`cell_end`, what the history answers), not its stored ``done``'s: the store
completes the row when the cell's end changes after its ``done`` went out (a
late ``error``; a followed cell's real end). Every cell keeps
``metadata.kernelgw`` (execution_id, status, duration_ms, reason) and the
standard ``metadata.execution`` timestamps. Markdown notes sit between the
executions they were added between (``after_seq``, see `NoteRecord`).

Export leaves out the executions a recovery by replay ran (``replay_of`` set):
the notebook is what the user ran. Restore (`replay_plan`,
`plan_from_executions`): the code cells to run again in a fresh kernel (again
without replayed executions). Cells whose execution did not complete (``timeout``, ``dead``,
``interrupted`` in ``metadata.kernelgw.status``; for a stored session, its `cell_end`)
are skipped: running them again
would most likely hang or kill the new kernel the same way, and what they did
before being stopped is unknown. Cells that raised are run again (whatever they
did before the exception is part of the state the analysis went on with).
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from kernelgw import events as ev
from kernelgw.kernels import DEFAULT_KERNEL, profile
from kernelgw.runtime.session import DETACHED_DONE_REASON

if TYPE_CHECKING:
    from nbformat import NotebookNode


def _nbformat() -> Any:
    """nbformat, imported when a notebook is first made or read, not at start-up.

    Its validator imports jsonschema, whose format checkers import
    ``rfc3987_syntax`` when installed (jsonschema's ``format-nongpl`` extra,
    which jupyter_server brings): that module compiles some 40 lark grammars
    at import, 1.3-1.8 s of CPU holding the GIL. The warm-up thread after a
    restart then slowed the first executes of the reattached sessions. It only
    checks the ``iri`` formats, which no notebook schema uses: it is kept out
    (jsonschema skips those checks when it cannot import it)."""
    if "nbformat" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    import nbformat
    import nbformat.v4

    return nbformat


def warm_up() -> None:
    """Import nbformat now (call it in a thread after start-up), so the first
    export or restore does not pay for the import."""
    _nbformat()


# nbformat's functions carry no annotations, and strict mypy will not call an
# unannotated function: the module reaches them through these typed wrappers.
def _new_output(*args: Any, **kwargs: Any) -> NotebookNode:
    node: NotebookNode = _nbformat().v4.new_output(*args, **kwargs)
    return node


def _new_code_cell(**kwargs: Any) -> NotebookNode:
    node: NotebookNode = _nbformat().v4.new_code_cell(**kwargs)
    return node


def _new_markdown_cell(**kwargs: Any) -> NotebookNode:
    node: NotebookNode = _nbformat().v4.new_markdown_cell(**kwargs)
    return node


def _new_notebook(**kwargs: Any) -> NotebookNode:
    node: NotebookNode = _nbformat().v4.new_notebook(**kwargs)
    return node


def _node(value: Mapping[str, Any]) -> NotebookNode:
    node: NotebookNode = _nbformat().NotebookNode(value)
    return node


def _from_dict(value: Mapping[str, Any]) -> NotebookNode:
    node: NotebookNode = _nbformat().from_dict(value)
    return node


def _writes(nb: NotebookNode) -> str:
    text: str = _nbformat().writes(nb)
    return text


SKIP_ON_REPLAY = frozenset({"timeout", "dead", "interrupted"})
"""Statuses of executions a restore does not run again (see the module docs)."""
_CELL_ID = re.compile(r"[^A-Za-z0-9_-]")


class ExecutionLike(Protocol):
    """What `build_notebook` reads of a stored execution (`ExecutionRecord` fits)."""

    @property
    def execution_id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def code(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def execution_count(self) -> int | None: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def duration_ms(self) -> float: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def events(self) -> list[ev.Event]: ...


class StoredEnd(Protocol):
    """What `cell_end` reads of a stored execution: its row's end."""

    @property
    def status(self) -> str: ...
    @property
    def execution_count(self) -> int | None: ...
    @property
    def duration_ms(self) -> float: ...
    @property
    def reason(self) -> str | None: ...


@dataclass(frozen=True)
class CellEnd:
    """How a stored cell ended (`cell_end`)."""

    status: str
    execution_count: int | None
    duration_ms: float
    reason: str | None


def cell_end(execution: StoredEnd) -> CellEnd:
    """How a stored cell ended, for every reader of the history: the history API,
    the notebook and the restore plan. Its row's status, count, duration and
    reason, not its stored ``done`` (the end its clients were sent), which the
    store corrects in the row and never in the events: ``error`` once an error
    came after that end (`Store.execution_late`), and the real end of a cell a
    drain cut off (its interim ``dead``, `interim`) once the next gateway
    followed it to its end (`Store.execution_followed`; one that ended while no
    gateway listened stays ``dead``, with that reason)."""
    return CellEnd(execution.status, execution.execution_count, execution.duration_ms, execution.reason)


def interim(done: ev.Done) -> bool:
    """Whether a stored ``done`` is the interim end of a cell a drain with
    ``on_shutdown=keep`` left running for the next gateway to follow: the output
    stored after it (as ``late``) is the cell's own, up to its real end (which
    only its row holds: `cell_end`)."""
    return done.status == "dead" and done.reason == DETACHED_DONE_REASON


class NoteLike(Protocol):
    @property
    def after_seq(self) -> int: ...
    @property
    def markdown(self) -> str: ...


# ------------------------------------------------------------------ export


class _Outputs:
    """The outputs of one cell as events arrive; display ids are notebook-wide."""

    def __init__(self, displays: dict[str, list[NotebookNode]]) -> None:
        self.items: list[NotebookNode] = []
        self._displays = displays
        self._clear_pending = False

    def add(self, event: ev.Event) -> None:
        if isinstance(event, ev.Stream):
            self._stream(event.name, event.text)
        elif isinstance(event, ev.Display):
            out = self._append(_new_output("display_data", data=dict(event.data), metadata=dict(event.metadata)))
            if event.display_id:
                self._displays.setdefault(event.display_id, []).append(out)
        elif isinstance(event, ev.UpdateDisplay):
            # Updates what is shown; not a new output, so no pending clear runs.
            for out in self._displays.get(event.display_id, []):
                out["data"] = _node(dict(event.data))
                out["metadata"] = _node(dict(event.metadata))
        elif isinstance(event, ev.Result):
            self._append(
                _new_output(
                    "execute_result",
                    data=dict(event.data),
                    metadata=dict(event.metadata),
                    execution_count=event.execution_count,
                )
            )
        elif isinstance(event, ev.Error):
            self._append(_new_output("error", ename=event.ename, evalue=event.evalue, traceback=list(event.traceback)))
        elif isinstance(event, ev.ClearOutput):
            if event.wait:
                self._clear_pending = True
            else:
                self.items.clear()
                self._clear_pending = False
        elif isinstance(event, ev.Truncated):
            self._stream("stderr", f"[kernelgw: {event.message}]\n")

    def note(self, text: str) -> None:
        self._stream("stderr", text)

    def _stream(self, name: str, text: str) -> None:
        self._run_pending_clear()
        last = self.items[-1] if self.items else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            last["text"] += text
        else:
            self.items.append(_new_output("stream", name=name, text=text))

    def _append(self, out: NotebookNode) -> NotebookNode:
        self._run_pending_clear()
        self.items.append(out)
        return out

    def _run_pending_clear(self) -> None:
        if self._clear_pending:
            self.items.clear()
            self._clear_pending = False


LATE_NOTE = "[kernelgw: what follows was sent after this execution had ended]\n"


def _cell_id(preferred: str, used: set[str]) -> str:
    base = _CELL_ID.sub("-", preferred)[:56] or "cell"
    candidate, n = base, 1
    while candidate in used:
        n += 1
        candidate = f"{base}-{n}"
    used.add(candidate)
    return candidate


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _code_cell(execution: ExecutionLike, displays: dict[str, list[NotebookNode]], used: set[str]) -> NotebookNode:
    outputs = _Outputs(displays)
    own = noted = False  # own: its late output is its own (after an interim end)
    for event in execution.events:
        if isinstance(event, ev.Done):
            own = interim(event)
        elif isinstance(event, ev.Late):
            if not own and not noted:
                noted = True
                outputs.note(LATE_NOTE)
            outputs.add(event.event)
        else:
            outputs.add(event)
    end = cell_end(execution)
    status, reason = end.status, end.reason
    if status in ("timeout", "dead"):
        outputs.note(f"[kernelgw: execution {status}" + (f": {reason}" if reason else "") + "]\n")
    finished = execution.started_at + timedelta(milliseconds=end.duration_ms)
    metadata: dict[str, Any] = {
        "execution": {
            "shell.execute_reply.started": _iso(execution.started_at),
            "shell.execute_reply": _iso(finished),
        },
        "kernelgw": {
            "execution_id": execution.execution_id,
            "status": status,
            "duration_ms": end.duration_ms,
        },
    }
    if reason:
        metadata["kernelgw"]["reason"] = reason
    cell = _new_code_cell(
        source=execution.code, execution_count=end.execution_count, outputs=outputs.items, metadata=metadata
    )
    cell["id"] = _cell_id(execution.execution_id, used)
    return cell


def build_notebook(
    executions: Iterable[ExecutionLike],
    notes: Iterable[NoteLike] = (),
    *,
    language_info: Mapping[str, Any] | None = None,
    session_id: str | None = None,
    image: str | None = None,
    kernel: str = DEFAULT_KERNEL,
) -> NotebookNode:
    """A valid nbformat v4 notebook of a session's executions and notes. The
    kernelspec is the gateway's name for the kernel; language_info is what the
    kernel reported, else the profile's (so Jupyter opens it in that language)."""
    displays: dict[str, list[NotebookNode]] = {}
    used: set[str] = set()
    pending_notes = sorted(notes, key=lambda n: n.after_seq)
    cells: list[NotebookNode] = []
    note_index = 0

    def add_note(note: NoteLike) -> None:
        cell = _new_markdown_cell(source=note.markdown)
        cell["id"] = _cell_id(f"note-{len(cells)}", used)
        cells.append(cell)

    for execution in sorted(executions, key=lambda e: e.seq):
        while note_index < len(pending_notes) and pending_notes[note_index].after_seq < execution.seq:
            add_note(pending_notes[note_index])
            note_index += 1
        cells.append(_code_cell(execution, displays, used))
    for note in pending_notes[note_index:]:
        add_note(note)

    metadata: dict[str, Any] = {
        "kernelspec": profile(kernel).kernelspec(),
        "language_info": dict(language_info or profile(kernel).language_info()),
    }
    if session_id is not None:
        metadata["kernelgw"] = {"session_id": session_id, **({"image": image} if image else {})}
    nb = _new_notebook(cells=cells, metadata=metadata)
    _nbformat().validate(nb)
    return nb


def notebook_text(nb: NotebookNode) -> str:
    """The notebook as the text of an .ipynb file."""
    return _writes(nb)


# ------------------------------------------------------------------ restore


class InvalidNotebook(ValueError):
    """The notebook is not valid nbformat v4; the message says why."""


@dataclass(frozen=True)
class ReplayStep:
    """One code cell to run again, or to skip (``skip_reason`` set)."""

    index: int
    """The cell's index in ``notebook.cells`` (for a stored session: the
    execution's position in its history)."""
    code: str
    skip_reason: str | None = None


def read_notebook(data: Mapping[str, Any]) -> NotebookNode:
    """Check a notebook given as decoded JSON; `InvalidNotebook` says what is wrong."""
    if not isinstance(data, Mapping):
        raise InvalidNotebook("the notebook must be a JSON object (the content of an .ipynb file)")
    major = data.get("nbformat")
    if major != 4:
        raise InvalidNotebook(f"only nbformat v4 notebooks can be restored; this one says nbformat={major!r}")
    cells = data.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, Mapping) for c in cells):
        raise InvalidNotebook("not a valid nbformat v4 notebook: cells: must be a list of cell objects")
    nb = _from_dict(dict(data))
    with warnings.catch_warnings():
        # a missing cell id is not worth refusing a notebook for
        warnings.simplefilter("ignore")
        nbformat = _nbformat()
        try:
            nbformat.validate(nb, version=4)
        except nbformat.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "notebook"
            raise InvalidNotebook(f"not a valid nbformat v4 notebook: {where}: {exc.message}") from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise InvalidNotebook(f"not a valid nbformat v4 notebook: {exc!r}") from None
    return nb


def _source(value: str | Sequence[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _skip_reason(status: str | None, code: str) -> str | None:
    if status in SKIP_ON_REPLAY:
        return f"the cell's original execution ended with status {status!r}, so it is not run again"
    if not code.strip():
        return "empty cell"
    return None


def replay_plan(nb: Mapping[str, Any]) -> list[ReplayStep]:
    """The code cells of a (validated) notebook, in order; markdown and raw cells
    are not replayed."""
    steps = []
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        code = _source(cell.get("source", ""))
        status = ((cell.get("metadata") or {}).get("kernelgw") or {}).get("status")
        steps.append(ReplayStep(index, code, _skip_reason(status, code)))
    return steps


def plan_from_executions(executions: Iterable[Any]) -> list[ReplayStep]:
    """The stored executions of a session (`ExecutionRecord`: ``position``, ``code``
    and `cell_end`), except replayed ones: they re-ran cells the plan runs already."""
    return [
        ReplayStep(e.position, e.code, _skip_reason(cell_end(e).status, e.code))
        for e in executions
        if getattr(e, "replay_of", None) is None
    ]
