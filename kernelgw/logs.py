"""The gateway's own logs on stderr: JSON lines for machines, or text for people.

``auto`` (the default) picks by where stderr goes: text on a terminal, where a
person reads it, and JSON lines anywhere else (a file, a pipe, a container's
log driver), so log shippers need no parsing rules. A JSON line holds time,
level, logger and message, plus whatever a call passes in ``extra`` (session
id, client address, ...).
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["auto", "json", "text"]


def resolve_format(fmt: LogFormat, stream: TextIO) -> Literal["json", "text"]:
    """``auto`` becomes text when ``stream`` is a terminal, JSON otherwise."""
    if fmt != "auto":
        return fmt
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "json"


def configure(fmt: LogFormat = "auto", level: int = logging.INFO, stream: TextIO | None = None) -> None:
    stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(stream)
    if resolve_format(fmt, stream) == "json":
        handler.setFormatter(
            JsonFormatter(
                "{asctime}{levelname}{name}{message}",
                style="{",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                datefmt="%Y-%m-%dT%H:%M:%S%z",
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in ("kernelgw", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(level)
