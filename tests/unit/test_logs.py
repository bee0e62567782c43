"""The gateway's own logs: one JSON object per line, extras included, or text on a terminal."""

from __future__ import annotations

import io
import json
import logging

import pytest

from kernelgw import logs


@pytest.fixture(autouse=True)
def _restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_level_logger_message_and_extras(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("json")
    logging.getLogger("kernelgw.test").warning("session %s reaped", "abc", extra={"session_id": "abc"})
    logging.getLogger("kernelgw.test").debug("not shown at INFO")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["level"] == "WARNING" and record["logger"] == "kernelgw.test"
    assert record["message"] == "session abc reaped" and record["session_id"] == "abc"
    assert "time" in record


def test_text_format_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("text")
    logging.getLogger("kernelgw.test").info("hello")
    assert capsys.readouterr().err.rstrip().endswith("INFO kernelgw.test: hello")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_text_on_a_terminal() -> None:
    terminal = _Terminal()
    logs.configure("auto", stream=terminal)
    logging.getLogger("kernelgw.test").info("hello")
    assert terminal.getvalue().rstrip().endswith("INFO kernelgw.test: hello")


def test_auto_is_json_lines_when_not_a_terminal() -> None:
    pipe = io.StringIO()
    logs.configure(stream=pipe)  # auto is the default
    logging.getLogger("kernelgw.test").info("hello")
    assert json.loads(pipe.getvalue())["message"] == "hello"


def test_an_explicit_format_wins_over_the_terminal_check() -> None:
    terminal = _Terminal()
    logs.configure("json", stream=terminal)
    logging.getLogger("kernelgw.test").info("hello")
    assert json.loads(terminal.getvalue())["message"] == "hello"
    assert logs.resolve_format("text", io.StringIO()) == "text"


def test_a_closed_stream_counts_as_no_terminal() -> None:
    closed = io.StringIO()
    closed.close()
    assert logs.resolve_format("auto", closed) == "json"
