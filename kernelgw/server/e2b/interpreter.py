"""E2B's code interpreter on a sandbox's kernel: ``/execute``, ``/contexts``, and envd's ``/health``.

``POST /e2b/execute`` runs a cell through the session's queue as ``/v1`` does
(admission for the sandbox's owner, then ``submit``) and streams E2B's NDJSON
(`kernelgw.server.e2b.ndjson`) as the session publishes the cell's events. A
client that goes away before the end (the SDK's ``timeout`` closes the
request) gets its cell interrupted: a queued one once it starts, a running one
at once and again while it runs on. Per-execution ``env_vars`` hold for that
cell only (`kernelgw.runtime.cell_env`, Python kernels).

A sandbox's default context is its kernel: its id is the same for the
sandbox's whole life, ``run_code`` with no language (or that context, or its
language) runs there, and it cannot be removed (kill the sandbox instead).
Every other context is a child session (`SessionManager.create_child`): a
kernel of its own, a process in the sandbox's container, so it shares the
sandbox's files, uid and limits. ``POST /contexts`` makes one (a language the
sandbox's image holds: its own and Python, or every language of the
code-interpreter image, `kernelgw.kernels.image_kernels`; another is a 400
naming the templates that hold it); ``run_code`` with a
language the default context does not run makes that language's default
context on first use, as E2B's server does; ``DELETE`` and ``restart`` act on
that kernel alone. Contexts end with the sandbox's kernel: a restart of the
default context, a pause, a kill, a gateway restart (the answer for one then
says why it ended).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictStr
from starlette.types import Receive, Scope, Send

from kernelgw import events as ev
from kernelgw.errors import ChildNotFound
from kernelgw.kernels import BUNDLES, CODE_INTERPRETER_BUNDLE, bundle_image, image_kernels, profile
from kernelgw.models import check_env
from kernelgw.runtime.backends.base import WORKSPACE_DIR
from kernelgw.runtime.execution import QueuedExecution
from kernelgw.runtime.manager import CHILD_CWD
from kernelgw.runtime.session import KernelSession, Subscription
from kernelgw.server.admission import admit
from kernelgw.server.drain import Drain
from kernelgw.server.e2b.errors import E2BError, E2BRoute
from kernelgw.server.e2b.ndjson import KEEPALIVE, Translation
from kernelgw.server.e2b.sandbox import ENVD_PORT, INTERPRETER_PORT, Sandbox, sandbox_for, wake
from kernelgw.server.e2b.templates import templates
from kernelgw.server.state import gateway_state
from kernelgw.tasks import BackgroundTasks, TurnTaker

log = logging.getLogger(__name__)

router = APIRouter(route_class=E2BRoute, tags=["e2b"])

KEEPALIVE_S = 5.0
"""A line at least this often while a cell is silent (E2B's interval): a write is
how a client gone without closing its connection is found out."""
BATCH_EVENTS = 64
"""Events already queued are sent in one write, up to this many."""
INTERRUPT_TRIES = 5
INTERRUPT_RETRY_S = 1.0
"""An abandoned cell is interrupted again this often while it runs on (a SIGINT
that lands before the kernel handles the request is lost), at most
`INTERRUPT_TRIES` times; its own timeout ends it after that."""

E2B_LANGUAGES = {"python3": "python", "deno": "javascript", "ir": "r", "bash": "bash", "java": "java"}
"""Each kernel's language as E2B names it (others keep kernelgw's name)."""
LANGUAGE_KERNELS = {
    "python": "python3",
    "javascript": "deno",
    "typescript": "deno",
    "r": "ir",
    "java": "java",
    "bash": "bash",
}
"""The kernel that runs each language E2B's code interpreter runs."""
KNOWN_LANGUAGES = frozenset(LANGUAGE_KERNELS)
DEFAULT_CONTEXT = "default:"
"""Names the child a language's default context is (`SessionManager.create_child`'s ``name``)."""
_CONTEXT_IDS = uuid.UUID("5f0f1c55-6b1e-4d8e-9a43-0c7e2b0e2b00")

_abandoned = BackgroundTasks("e2b execute")
"""Interrupts of cells whose client went away (they outlive the request)."""


class ExecuteBody(BaseModel):
    """E2B's ``ExecutionRequest``."""

    code: StrictStr
    context_id: StrictStr | None = None
    language: StrictStr | None = None
    env_vars: dict[StrictStr, StrictStr] | None = None


class CreateContextBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cwd: StrictStr | None = None
    language: StrictStr | None = None


class Context(BaseModel):
    id: str
    language: str
    cwd: str


# ---------------------------------------------------------------- contexts
def normalize_language(language: str | None) -> str:
    """E2B's spelling: absent is python, ``js`` javascript, ``ts`` typescript."""
    name = (language or "python").strip().lower()
    return {"js": "javascript", "ts": "typescript"}.get(name, name)


def context_language(session: KernelSession) -> str:
    kernel = session.spec.kernel
    return E2B_LANGUAGES.get(kernel, profile(kernel).language.lower())


def runs_language(session: KernelSession, language: str) -> bool:
    own = context_language(session)
    return language == own or (own == "javascript" and language == "typescript")


def default_context(session: KernelSession) -> Context:
    """The sandbox's one context: its kernel. The id is derived from the sandbox's
    (the same across restarts, as E2B keeps a context's), the cwd is where the
    kernel runs."""
    context_id = str(uuid.uuid5(_CONTEXT_IDS, session.id))
    return Context(id=context_id, language=context_language(session), cwd=WORKSPACE_DIR)


def child_context(child: KernelSession) -> Context:
    """A context the sandbox holds besides its kernel: a child session."""
    host = child.spec.host
    return Context(
        id=child.id,
        language=child.child_label or context_language(child),
        cwd=host.cwd if host is not None else CHILD_CWD,
    )


def _unknown_language(language: str) -> E2BError:
    return E2BError(
        HTTPStatus.BAD_REQUEST,
        f"language {language!r} is not one E2B's code interpreter runs ({', '.join(sorted(KNOWN_LANGUAGES))})",
        error_code="bad_request",
    )


def kernel_for(language: str, session: KernelSession, request: Request) -> str:
    """The kernel a context of ``language`` runs in this sandbox, or the 400 that
    says which templates hold it when its image does not."""
    kernel = LANGUAGE_KERNELS.get(language)
    if kernel is None:
        raise _unknown_language(language)
    held = image_kernels(session.spec.kernel, session.spec.image)
    if kernel in held:
        return kernel
    settings = gateway_state(request).settings
    offered = sorted(t.id for t in templates(settings).values() if kernel in image_kernels(t.kernel, t.image))
    where = (
        f"templates {offered} on this gateway do"
        if offered
        else f"no template of this gateway does (its e2b_templates setting can map one to the {kernel} kernel, "
        f'e.g. {{"{kernel}-v1": "{kernel}"}})'
    )
    if kernel in BUNDLES[CODE_INTERPRETER_BUNDLE] and session.spec.image != bundle_image(CODE_INTERPRETER_BUNDLE):
        where += (
            "; or build the image of every language E2B's code interpreter runs (kernelgw image build --kernel "
            "code-interpreter), which new code-interpreter-v1 sandboxes then run"
        )
    raise E2BError(
        HTTPStatus.BAD_REQUEST,
        f"language {language!r} needs the {kernel} kernel, which this sandbox's image ({session.spec.image}) "
        f"does not hold (it holds {' and '.join(held)}): {where}. Create a sandbox from one of those.",
        error_code="kernel_not_in_image",
    )


def _child(request: Request, session: KernelSession, context_id: str) -> KernelSession:
    try:
        return gateway_state(request).manager.get_child(session, context_id)
    except ChildNotFound as exc:
        raise E2BError(HTTPStatus.NOT_FOUND, exc.message, error_code="context_not_found") from None


async def _target(request: Request, sandbox: Sandbox, context_id: str | None, language: str | None) -> KernelSession:
    """The session a cell runs in: the context named, else the default context of
    ``language`` (made on first use when the sandbox's kernel runs another), else
    the sandbox's kernel."""
    session = sandbox.session
    if context_id is not None:
        return session if context_id == default_context(session).id else _child(request, session, context_id)
    if language is None or runs_language(session, name := normalize_language(language)):
        return session
    kernel = kernel_for(name, session, request)
    await wake(request, session)
    return await gateway_state(request).manager.create_child(session, kernel, name=DEFAULT_CONTEXT + name, label=name)


@router.get("/e2b/contexts", response_model=list[Context])
async def list_contexts(request: Request) -> list[Context]:
    sandbox = await sandbox_for(request, INTERPRETER_PORT)
    return [default_context(sandbox.session), *(child_context(c) for c in sandbox.session.children)]


@router.post("/e2b/contexts", response_model=Context)
async def create_context(body: CreateContextBody, request: Request) -> Context:
    """A new context: a kernel of its own in the sandbox's container (a paused
    sandbox is resumed first), working in ``cwd`` (E2B's home by default)."""
    sandbox = await sandbox_for(request, INTERPRETER_PORT)
    language = normalize_language(body.language)
    kernel = kernel_for(language, sandbox.session, request)
    await wake(request, sandbox.session)
    child = await gateway_state(request).manager.create_child(
        sandbox.session, kernel, cwd=body.cwd or CHILD_CWD, label=language
    )
    return child_context(child)


@router.delete("/e2b/contexts/{context_id}")
async def remove_context(context_id: str, request: Request) -> Response:
    sandbox = await sandbox_for(request, INTERPRETER_PORT)
    session = sandbox.session
    if context_id != default_context(session).id:
        _child(request, session, context_id)
        await gateway_state(request).manager.delete_child(session, context_id, "removed (remove_code_context)")
        return JSONResponse(None)
    raise E2BError(
        HTTPStatus.BAD_REQUEST,
        f"Context {context_id} is the sandbox's own kernel, its default context: it cannot be removed. "
        "Restart it (restart_code_context) for a fresh state, or kill the sandbox.",
        error_code="bad_request",
    )


@router.post("/e2b/contexts/{context_id}/restart")
async def restart_context(context_id: str, request: Request) -> Response:
    """A fresh kernel in place of the old one (`KernelSession.restart`): variables go,
    files stay. The default context's is the sandbox's kernel: the other contexts
    end with its container. A paused sandbox's new kernel gets its snapshot's
    files and packages (the runtime's restart of a paused session, on every face)."""
    sandbox = await sandbox_for(request, INTERPRETER_PORT)
    session = sandbox.session
    if context_id != default_context(session).id:
        await _child(request, session, context_id).restart("the code interpreter's context was restarted (E2B)")
        return JSONResponse(None)
    await session.restart("the code interpreter's context was restarted (E2B)")
    return JSONResponse(None)


# ---------------------------------------------------------------- health
@router.get("/e2b/health")
async def health(request: Request) -> Response:
    """envd's health (port 49983): 204 while the sandbox exists (running or
    paused), E2B's 502 once it is gone (the SDK's ``is_running``). The code
    interpreter's (49999) answers as E2B's does."""
    sandbox = await sandbox_for(request, ENVD_PORT, INTERPRETER_PORT)
    if sandbox.port == INTERPRETER_PORT:
        return JSONResponse("OK")
    return Response(status_code=HTTPStatus.NO_CONTENT)


# ---------------------------------------------------------------- execute
@router.post("/e2b/execute")
async def execute(body: ExecuteBody, request: Request) -> Response:
    """Run the cell in the sandbox's kernel and stream its output as E2B's NDJSON."""
    sandbox = await sandbox_for(request, INTERPRETER_PORT)
    if body.context_id is not None and body.language is not None:
        raise E2BError(
            HTTPStatus.BAD_REQUEST, "Only one of context_id or language can be provided", error_code="bad_request"
        )
    session = await _target(request, sandbox, body.context_id, body.language)
    env = _cell_env(body.env_vars or {}, session)
    state = gateway_state(request)
    await admit(state, sandbox.principal, body.code, session.spec.kernel)
    await wake(request, sandbox.session)
    sub = session.subscribe()  # before the cell is queued: none of its events is missed
    try:
        rec = session.submit(body.code)
    except BaseException:
        session.unsubscribe(sub)
        raise
    # before anything awaits: the worker reads these when it takes the cell
    rec.env = env
    rec.retain_output = True  # what a subscription that fell behind missed is read from here
    return ExecutionStream(session, rec, sub, state.drain)


def _cell_env(env: dict[str, str], session: KernelSession) -> dict[str, str]:
    """``env_vars`` under the rule every face applies (`check_env`)."""
    if not env:
        return {}
    if not profile(session.spec.kernel).python:
        raise E2BError(
            HTTPStatus.BAD_REQUEST,
            f"env_vars per execution are set in Python kernels only; this sandbox runs {session.spec.kernel} "
            "(give them when the sandbox is created instead)",
            error_code="bad_request",
        )
    try:
        return dict(check_env(env))
    except ValueError as exc:
        raise E2BError(HTTPStatus.BAD_REQUEST, f"env_vars: {exc}", error_code="bad_request") from None


class ExecutionStream(StreamingResponse):
    """The NDJSON answer of one cell: its lines as the session publishes its
    events, until its end. A drain that closes first ends the stream (the cell
    and the kernel are left to the shutdown); a client that leaves first, even
    before the first line, gets its cell interrupted."""

    def __init__(self, session: KernelSession, rec: QueuedExecution, sub: Subscription, drain: Drain) -> None:
        self.session, self.rec, self.sub, self.drain = session, rec, sub, drain
        self.translation = Translation()
        self.closer: asyncio.Task[None] | None = None
        """Closes the subscription at the drain's close (while the answer is sent)."""
        super().__init__(self._lines(), media_type="application/x-ndjson")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.closer = closer = asyncio.create_task(
            _close_at_drain(self.drain, self.sub), name=f"e2b-drain-{self.rec.execution_id}"
        )
        try:
            await super().__call__(scope, receive, send)
        finally:
            # nothing awaits here: a cancelled request's task is cancelled again at every await
            self.session.unsubscribe(self.sub)
            closer.cancel()
            if not self.translation.ended:  # the client went away: the cell must not run on for nobody
                rec = self.rec
                _abandoned.spawn(_interrupt_abandoned(self.session, rec), name=f"interrupt-{rec.execution_id}")

    async def _lines(self) -> AsyncIterator[str]:
        rec, sub, translation = self.rec, self.sub, self.translation
        sent = 0
        """The seq of the cell's last event passed on."""
        marker = f'"execution_id":"{rec.execution_id}"'
        turns = TurnTaker()
        while not translation.ended:
            texts = await _next_texts(sub)
            if texts is None:
                yield KEEPALIVE
                continue
            lines: list[str] = []
            for text in texts:
                if text is None:
                    break
                if marker not in text:
                    continue
                event = _event(text)
                if event.execution_id != rec.execution_id or event.seq is None:
                    continue
                sent = event.seq
                lines += translation.feed(event, datetime.now(UTC))
            if lines:
                yield "".join(lines)
                await turns.step()
            if texts and texts[-1] is None and not translation.ended and self.closer is not None:
                # the subscription ended: the drain closed it, or it fell behind, or the session closed
                async for chunk in _after_subscription(rec, translation, sent, self.closer):
                    yield chunk


def _event(text: str) -> ev.Event:
    """An event as the session published it (its JSON was made from a checked model)."""
    return ev.EVENT_ADAPTER.validate_json(text, context=ev.TEXT_CHECKED)


async def _next_texts(sub: Subscription) -> list[str | None] | None:
    """The next event texts (what is queued already, up to `BATCH_EVENTS`; a
    closed subscription's end as None, last), or None after `KEEPALIVE_S` of silence."""
    try:
        async with asyncio.timeout(KEEPALIVE_S):
            first = await sub.get()
    except TimeoutError:
        return None
    texts: list[str | None] = [first]
    while first is not None and len(texts) < BATCH_EVENTS and not sub.queue.empty():
        texts.append(await sub.get())  # queued: returns without suspending
        if texts[-1] is None:
            break
    return texts


async def _after_subscription(
    rec: QueuedExecution, translation: Translation, sent: int, closer: asyncio.Task[None]
) -> AsyncIterator[str]:
    """After the subscription ended early: at a drain's close, the end of the
    stream (E2B's unexpected end, the cell left running); else (it fell too far
    behind, or the session is closing) the rest of the cell's events from its
    record once it is over."""
    ends: set[asyncio.Future[Any]] = {rec.done, closer}
    while not rec.done.done() and not closer.done():
        await asyncio.wait(ends, timeout=KEEPALIVE_S)
        if not rec.done.done() and not closer.done():
            yield KEEPALIVE
    if not rec.done.done():
        yield "".join(
            translation.cut_short(
                f"the gateway is restarting and stopped streaming execution {rec.execution_id} before it ended: "
                "its record (output and how it ended) is in the sandbox's history; do not run it again blindly"
            )
        )
        return
    lines: list[str] = []
    for pub in rec.published:
        if pub.seq <= sent:
            continue
        lines += translation.feed(pub.event if pub.event is not None else _event(pub.json), datetime.now(UTC))
    if not translation.ended:  # its done is its last event, always published: this is a safety net
        done = rec.done.result()
        lines += translation.feed(done, datetime.now(UTC))
    yield "".join(lines)


async def _close_at_drain(drain: Drain, sub: Subscription) -> None:
    await drain.wait_closing()
    sub.close()


async def _interrupt_abandoned(session: KernelSession, rec: QueuedExecution) -> None:
    """Interrupt a cell nobody waits for any more: once it runs (a queued cell when
    it starts), then again while it runs on, `INTERRUPT_TRIES` times at most."""
    tries = 0
    while not rec.done.done() and tries < INTERRUPT_TRIES:
        if session.current_execution is rec:
            tries += 1
            if await session.interrupt():
                log.info("execution %s: its E2B client went away; interrupted", rec.execution_id)
        await asyncio.wait({rec.done}, timeout=INTERRUPT_RETRY_S)
