"""The gateway's own logs: one JSON object per line, extras included."""

from __future__ import annotations

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
