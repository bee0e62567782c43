"""What of a cell's iopub output is published, and how much of it.

Each message becomes an event (`iopub.to_event`); errors are trimmed but never
dropped (the error is what a model needs); other output counts against the
execution's byte cap, and images over their own cap are replaced by a note.
Whatever is cut, a ``truncated`` event says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelgw import events as ev
from kernelgw.runtime.execution import QueuedExecution, message_order
from kernelgw.runtime.iopub import payload_size, to_event, trim_error
from kernelgw.runtime.session_config import SessionConfig

ERROR_MAX_BYTES = 64 * 1024
"""An error event is trimmed to about this (message and traceback), whatever the
output cap: a 40 MB exception message says nothing a model can use."""
_OUTPUT_EVENTS = (ev.Stream, ev.Display, ev.UpdateDisplay, ev.Result, ev.ClearOutput)
_BUNDLE_EVENTS = (ev.Display, ev.UpdateDisplay, ev.Result)
BundleEvent = ev.Display | ev.UpdateDisplay | ev.Result
Publish = Callable[[ev.Event, QueuedExecution], object]


class CellOutput:
    def __init__(self, config: SessionConfig, publish: Publish) -> None:
        self.config = config
        self._publish = publish

    def handle(self, rec: QueuedExecution, msg: dict[str, Any]) -> None:
        """One iopub message of a running execution (the kernel link routed it)."""
        event = to_event(msg, rec.execution_id)
        if event is None:
            return
        if isinstance(event, ev.Status):
            if event.state == "idle":
                rec.note_idle(msg)
            # forward busy only; idle is implied by done
            if event.state == "busy":
                self._publish(event, rec)
            return
        if isinstance(event, ev.Error):
            # never dropped (the error is what a model needs), but trimmed
            event = trim_error(event, ERROR_MAX_BYTES)
            order = message_order(msg)
            if order is not None:
                rec.error_order = max(order, rec.error_order or order)
            rec.output_bytes += payload_size(event)
        elif isinstance(event, _OUTPUT_EVENTS):
            if rec.truncated:
                return
            if isinstance(event, _BUNDLE_EVENTS):
                event = self._cap_images(event, rec)
            room = self.config.max_output_bytes - rec.output_bytes
            rec.output_bytes += payload_size(event)
            if rec.output_bytes > self.config.max_output_bytes:
                rec.truncated = True
                if isinstance(event, ev.Stream) and room > 0:
                    # the head of the stream that crossed the cap, up to the cap: one
                    # 40 MB print must not deliver nothing
                    self._publish(event.model_copy(update={"text": event.text[:room]}), rec)
                self.truncated(
                    rec,
                    self.config.max_output_bytes,
                    f"output exceeded {self.config.max_output_bytes} bytes; the rest of "
                    "this execution's output was dropped (the code kept running)",
                )
                return
        self._publish(event, rec)

    def _cap_images(self, event: BundleEvent, rec: QueuedExecution) -> BundleEvent:
        """Replace images over ``max_image_bytes`` with a note (and say so)."""
        event, message = cap_images(event, self.config.max_image_bytes)
        if message is not None:
            self.truncated(rec, self.config.max_image_bytes, message)
        return event

    def truncated(self, rec: QueuedExecution, limit: int, message: str) -> None:
        self._publish(ev.Truncated(execution_id=rec.execution_id, limit_bytes=limit, message=message), rec)

    def message_refused(self, rec: QueuedExecution) -> None:
        limit = self.config.max_message_bytes
        self.truncated(
            rec,
            limit,
            f"the kernel sent a message larger than {limit} bytes; "
            "it was dropped, and output until the connection recovered may be missing "
            "(the code kept running)",
        )


def cap_images(event: BundleEvent, limit: int) -> tuple[BundleEvent, str | None]:
    """``event`` with its images over ``limit`` bytes replaced by a note, and the
    message of the ``truncated`` event that says so (None: nothing replaced)."""
    big = {
        mime: len(value)
        for mime, value in event.data.items()
        if mime.startswith("image/") and isinstance(value, str) and len(value) > limit
    }
    if not big:
        return event, None
    data = {k: v for k, v in event.data.items() if k not in big}
    note = "; ".join(f"{mime} of {size} bytes" for mime, size in big.items())
    data["text/plain"] = f"[{note} removed: larger than the gateway's image limit of {limit} bytes]"
    message = f"an image ({note}) exceeded the limit of {limit} bytes and was replaced by a note"
    return event.model_copy(update={"data": data}), message
