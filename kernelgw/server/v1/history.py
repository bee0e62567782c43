"""History endpoints: notebook export, notes, the stored history; restore helpers.

Export and history read the store, so they work for live sessions and for
deleted ones (until their history is purged). Notes go to live sessions only.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from kernelgw.errors import (
    BadRequest,
    HistoryNotFound,
    PayloadTooLarge,
    SessionNotFound,
)
from kernelgw.models import (
    CreateSession,
    ErrorResponse,
    HistoryResponse,
    NoteRequest,
    NoteResponse,
)
from kernelgw.runtime.manager import SessionManager
from kernelgw.runtime.session import KernelSession
from kernelgw.server.admission import check_code
from kernelgw.server.auth import authenticate, principal_of, session_for
from kernelgw.server.notebook import (
    InvalidNotebook,
    ReplayStep,
    build_notebook,
    cell_end,
    notebook_text,
    plan_from_executions,
    read_notebook,
    replay_plan,
)
from kernelgw.server.state import gateway_state
from kernelgw.storage import SessionRecord, Store

_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 503)}
router = APIRouter(responses=_errors, tags=["history"], dependencies=[Depends(authenticate)])
IPYNB_MEDIA_TYPE = "application/x-ipynb+json"


def _store(request: Request) -> Store:
    return gateway_state(request).store


def _manager(request: Request) -> SessionManager:
    return gateway_state(request).manager


async def _record(request: Request, session_id: str) -> SessionRecord:
    """The stored session if the caller may see it (another key's is a 404)."""
    record = await _store(request).get_session(session_id)
    if record is None or not principal_of(request).can_see(record.owner):
        raise HistoryNotFound(session_id)
    return record


@router.get(
    "/v1/sessions/{session_id}/notebook",
    responses={200: {"content": {IPYNB_MEDIA_TYPE: {}}, "description": "An nbformat v4 notebook."}},
)
async def export_notebook(session_id: str, request: Request) -> Response:
    """The session as a Jupyter notebook: one code cell per execution with its outputs,
    notes as markdown cells. Works after the session was deleted, until its history
    is purged."""
    store = _store(request)
    record = await _record(request, session_id)
    # replayed executions re-ran earlier cells: the notebook is what the user ran
    executions = [e for e in await store.list_executions(session_id) if e.replay_of is None]
    notes = await store.list_notes(session_id)
    # Parsing events and validating is CPU work that grows with the outputs: off the loop.
    text = await asyncio.to_thread(
        lambda: notebook_text(
            build_notebook(
                executions,
                notes,
                language_info=record.language_info,
                session_id=record.id,
                image=record.image,
                kernel=record.kernel,
            )
        )
    )
    filename = re.sub(r"[^A-Za-z0-9_.-]", "_", f"kernelgw-{session_id}.ipynb")
    return Response(
        text,
        media_type=IPYNB_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.post("/v1/sessions/{session_id}/notes", status_code=201, response_model=NoteResponse)
async def add_note(session_id: str, body: NoteRequest, request: Request) -> dict[str, Any]:
    """Add a markdown cell at the current position: after every execution queued so
    far (also one still running), before any queued later."""
    session = session_for(request, session_id)
    limit = gateway_state(request).settings.max_code_bytes
    if len(body.markdown.encode("utf-8", "surrogatepass")) > limit:
        raise PayloadTooLarge(f"markdown is larger than the gateway's limit of {limit} bytes")
    note = await _store(request).add_note(session.id, session.last_seq, body.markdown)
    session.touch()
    return {"session_id": note.session_id, "after_seq": note.after_seq, "created_at": note.created_at}


@router.get("/v1/sessions/{session_id}/history", response_model=HistoryResponse)
async def history(session_id: str, request: Request) -> Response:
    """Every stored execution of the session (code, status, timings, all its events)
    and its notes, live or deleted. A replayed execution names the one it re-ran
    in ``replay_of``."""
    store = _store(request)
    record = await _record(request, session_id)
    executions = await store.list_executions(session_id)
    notes = await store.list_notes(session_id)
    parts = []
    for e in executions:
        end = cell_end(e)  # as the notebook and a restore see it
        head = json.dumps(
            {
                "execution_id": e.execution_id,
                "position": e.position,
                "code": e.code,
                "status": end.status,
                "execution_count": end.execution_count,
                "started_at": e.started_at.isoformat(),
                "duration_ms": end.duration_ms,
                "reason": end.reason,
                "state_lost": e.state_lost,
                "replay_of": e.replay_of,
                "replayable": e.replayable,
            }
        )
        # the stored events are the JSON texts clients received: splice them
        parts.append(head[:-1] + ',"events":' + e.events_json + "}")
    body = json.dumps(
        {
            "session_id": record.id,
            "created_at": record.created_at.isoformat(),
            "ended_at": record.ended_at.isoformat() if record.ended_at else None,
            "end_reason": record.end_reason,
            "image": record.image,
            "notes": [
                {"after_seq": n.after_seq, "markdown": n.markdown, "created_at": n.created_at.isoformat()}
                for n in notes
            ],
            "executions": [],
        }
    )
    text = body[: -len("[]}")] + "[" + ",".join(parts) + "]}"
    return Response(text, media_type="application/json")


# ------------------------------------------------------------------ restore


async def restore_plan(body: CreateSession, request: Request) -> list[ReplayStep] | None:
    """The cells a new session must replay (None: not a restore). Checked before any
    kernel starts: an invalid notebook is a 400, an unknown session a 404."""
    if body.notebook is not None:
        try:
            # in a thread: parsing is CPU work, and nbformat's first import is slow
            steps = replay_plan(await asyncio.to_thread(read_notebook, body.notebook))
        except InvalidNotebook as exc:
            raise BadRequest(f"notebook: {exc}") from None
    elif body.from_session is not None:
        await _record(request, body.from_session)
        steps = plan_from_executions(await _store(request).list_executions(body.from_session))
    else:
        return None
    for step in steps:
        if not step.skip_reason:
            await check_code(
                gateway_state(request),
                step.code,
                where=f"cell {step.index}: ",
                kernel=body.kernel or gateway_state(request).settings.default_kernel,
            )
    return steps


async def replay(session: KernelSession, steps: list[ReplayStep]) -> list[dict[str, Any]]:
    """Run the cells in order, each after the previous one finished.

    A cell that fails (raises, times out and is interrupted) does not stop the
    replay: later cells often do not depend on it, and the report says which
    failed. A cell that loses the kernel's state (the kernel died, or was
    restarted after ignoring a timeout interrupt) stops it: what follows would
    run against an empty kernel, and the remaining cells are reported skipped.
    """
    report: list[dict[str, Any]] = []
    stopped: str | None = None
    for step in steps:
        if stopped or step.skip_reason:
            report.append({"index": step.index, "status": "skipped", "reason": stopped or step.skip_reason})
            continue
        rec = session.submit(step.code)
        done = await rec.done
        error = rec.last_error
        report.append(
            {
                "index": step.index,
                "status": done.status,
                "execution_count": done.execution_count,
                "ename": error.ename if error else None,
                "evalue": error.evalue if error else None,
                "reason": done.reason,
                "duration_ms": done.duration_ms,
            }
        )
        if done.status == "dead" or done.state_lost:
            stopped = f"not run: the kernel lost its state while replaying cell {step.index} ({done.reason})"
    return report


async def create_restored(
    manager: SessionManager, session: KernelSession, steps: list[ReplayStep]
) -> list[dict[str, Any]]:
    """Replay into a just-created session; if the request is abandoned (the client
    went away) the half-restored session is deleted rather than left to the reaper."""
    try:
        return await replay(session, steps)
    except BaseException:
        try:
            await asyncio.shield(manager.delete(session.id, reason="restore abandoned"))
        except (SessionNotFound, asyncio.CancelledError):
            pass
        raise
