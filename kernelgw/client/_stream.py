"""`_StreamState`: the WebSocket protocol of one streamed execution, without the
I/O. `Session.stream` and `AsyncSession.stream` drive it with websockets' sync or
asyncio client.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, NoReturn, Protocol

from websockets.exceptions import ConnectionClosed, InvalidStatus

from kernelgw.client._errors import error_from_close, error_from_response
from kernelgw.errors import ClientError
from kernelgw.events import EVENT_TYPES, Done, Event, Gap, ProtocolError, parse_event

MAX_RESUMES = 3
"""How often a stream reconnects (with ``last_seq``) after the connection drops."""
RESUMABLE_CLOSE_CODES = frozenset({4008})
"""Close codes after which a stream reconnects: 4008 = the client fell behind."""


class _StreamClient(Protocol):
    """What a stream needs of its client; `_BaseClient` has it."""

    headers: dict[str, str]
    timeout: float | None

    def _ws_url(self, session_id: str, last_seq: int | None = None) -> str: ...


class _StreamState:
    """The WebSocket protocol of one streamed execution, without the I/O.

    The shell loop is: connect to `url`; send `hello()` if not None; `feed` every
    frame and yield what it returns until `finished`. When the connection closes
    early, `closed` either raises or returns, and the loop reconnects: the
    execution keeps running on the gateway, and ``last_seq`` replays what was
    missed. The execute message is sent only until the gateway acknowledges it
    with an event, so a reconnect never runs the code twice.
    """

    def __init__(
        self, client: _StreamClient, session_id: str, code: str, timeout: float | None, *, replay: bool = True
    ) -> None:
        self._client = client
        self.session_id = session_id
        self.execution_id = uuid.uuid4().hex
        message: dict[str, Any] = {
            "type": "execute",
            "code": code,
            "execution_id": self.execution_id,
        }
        if timeout is not None:
            message["timeout"] = timeout
        if not replay:
            message["replay"] = False
        self._message = json.dumps(message)
        self.last_seq: int | None = None
        self.accepted = False
        self.finished = False
        self.resumes = 0

    @property
    def url(self) -> str:
        return self._client._ws_url(self.session_id, self.last_seq if self.accepted else None)

    def connect_options(self) -> dict[str, Any]:
        return {
            "additional_headers": self._client.headers or None,
            "open_timeout": self._client.timeout,
            "max_size": None,  # images can be large; the gateway caps output
        }

    def hello(self) -> str | None:
        return None if self.accepted else self._message

    def feed(self, frame: str | bytes) -> Event | None:
        """Parse one frame; return the event if it belongs to this execution.
        Event types newer than this SDK are passed over (their ``seq`` counts)."""
        try:
            data: str | bytes | dict[str, Any] = json.loads(frame)
        except ValueError:
            data = frame  # parse_event says what is wrong with it
        if isinstance(data, dict) and data.get("type") not in EVENT_TYPES:
            seq = data.get("seq")
            if isinstance(seq, int) and (self.last_seq is None or seq > self.last_seq):
                self.last_seq = seq
            return None
        event = parse_event(data)
        if event.seq is not None:
            if self.last_seq is not None and event.seq <= self.last_seq:
                return None  # replayed after a reconnect, already seen
            self.last_seq = event.seq
        if isinstance(event, ProtocolError) and event.execution_id in (None, self.execution_id):
            raise ClientError(400, "protocol_error", event.message)
        if isinstance(event, Gap):
            raise ClientError(
                502,
                "events_lost",
                f"events {event.first_missing}..{event.last_missing} of execution "
                f"{self.execution_id} are no longer available after a reconnect",
            )
        if event.execution_id != self.execution_id:
            return None
        self.accepted = True
        if isinstance(event, Done):
            self.finished = True
        return event

    def closed(self, code: int | None, reason: str) -> None:
        """The connection ended before ``done``: raise, or return to reconnect.

        ``4xxx`` codes are the gateway's errors (``4404``: no such session),
        except ``4008``: this client fell behind and may resume.
        """
        if code is not None and 4000 <= code < 5000 and code not in RESUMABLE_CLOSE_CODES:
            raise error_from_close(code, reason)
        if self.accepted and self.last_seq is not None and self.resumes < MAX_RESUMES:
            self.resumes += 1
            return
        raise ClientError(
            502,
            "connection_closed",
            f"the WebSocket closed (code {code}{': ' + reason if reason else ''}) "
            f"before execution {self.execution_id} finished",
        )

    def connection_closed(self, exc: ConnectionClosed) -> None:
        frame = exc.rcvd
        self.closed(frame.code if frame is not None else 1006, frame.reason if frame else "")

    @staticmethod
    def rejected(exc: InvalidStatus) -> NoReturn:
        """The gateway refused the WebSocket handshake with an HTTP answer."""
        response = exc.response
        raise error_from_response(response.status_code, bytes(response.body or b""), response.reason_phrase)
