"""The kernel's answer to a pause (`kernelgw.runtime.pause`): read as the
untrusted text it is, and a pause that saved none of the variables because they
could not be written is refused rather than answered 200."""

from __future__ import annotations

from typing import Any

import pytest

from kernelgw.runtime.pause import (
    NamespaceSummary,
    SnapshotFailed,
    SnapshotTooLarge,
    parse_summary,
    refuse_if_nothing_saved,
)


def reply(text: Any) -> dict[str, Any]:
    return {"user_expressions": {"snapshot": {"status": "ok", "data": {"text/plain": text}}}}


def test_a_write_that_failed_is_refused_with_its_reason() -> None:
    summary = NamespaceSummary(failed={"*": "OSError: [Errno 28] No space left on device"})
    with pytest.raises(SnapshotTooLarge) as caught:
        refuse_if_nothing_saved(summary)
    assert caught.value.status_code == 413
    assert "No space left on device" in caught.value.message and "goes on running" in caught.value.message


def test_variables_that_could_not_be_pickled_are_named_not_refused() -> None:
    # the others are saved, and a resume with replay rebuilds the rest
    refuse_if_nothing_saved(NamespaceSummary(done=["total"], failed={"squares": "TypeError: generator"}))
    refuse_if_nothing_saved(NamespaceSummary(failed={"squares": "TypeError: generator"}))
    refuse_if_nothing_saved(NamespaceSummary())


def test_a_helper_that_failed_or_did_not_answer_is_a_snapshot_failure() -> None:
    with pytest.raises(SnapshotFailed):
        parse_summary(None, "snapshot", "saved")
    failed = {"user_expressions": {"snapshot": {"status": "error", "ename": "ImportError", "evalue": "x"}}}
    with pytest.raises(SnapshotFailed, match="ImportError"):
        parse_summary(failed, "snapshot", "saved")


def test_the_summary_is_read_as_untrusted_text() -> None:
    text = '{"saved": ["x", 7], "modules": {"np": "numpy"}, "failed": {"*": "disk full"}, "bytes": -3}'
    summary = parse_summary(reply(text), "snapshot", "saved")
    assert summary == NamespaceSummary(done=["x", "7"], modules={"np": "numpy"}, failed={"*": "disk full"}, bytes=0)
    for bad in ("[1, 2]", "not json", 42, "x" * (2 << 20)):
        with pytest.raises(SnapshotFailed, match="no usable summary"):
            parse_summary(reply(bad), "snapshot", "saved")
