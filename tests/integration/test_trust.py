"""The gateway trusts nothing the kernel sends (it holds its own HMAC key)."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.conftest import run, stdout

pytestmark = pytest.mark.integration


def test_garbage_and_badly_signed_messages_are_dropped(http: httpx.Client, session_id: str) -> None:
    code = (
        "k = get_ipython().kernel\n"
        "sock = k.iopub_socket\n"
        "sock.send_multipart([b'garbage'])\n"
        "sock.send_multipart([b'topic', b'<IDS|MSG>', b'bad-signature', b'{}', b'{}', b'{}', b'{not json'])\n"
        "print('sent', flush=True)\n"
    )
    result = run(http, session_id, code)
    assert result["status"] == "ok"
    assert stdout(result) == "sent\n"
    # the readers survived: the session keeps working
    assert stdout(run(http, session_id, "print('alive')")) == "alive\n"


def test_forged_idle_and_reply_for_another_request_are_ignored(http: httpx.Client, session_id: str) -> None:
    # Correctly signed (the kernel has the key) but claiming to answer requests the
    # gateway never sent: they must neither end this execution early nor show up.
    code = (
        "import time\n"
        "k = get_ipython().kernel\n"
        "fake_parent = {'msg_id': 'not-a-request-of-the-gateway', 'msg_type': 'execute_request'}\n"
        "k.session.send(k.iopub_socket, 'status', {'execution_state': 'idle'}, parent=fake_parent)\n"
        "k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': 'FORGED'}, parent=fake_parent)\n"
        "time.sleep(0.5)\n"
        "print('real end')\n"
    )
    result = run(http, session_id, code)
    assert result["status"] == "ok"
    assert stdout(result) == "real end\n"
    assert [e["type"] for e in result["events"]] == ["queued", "status", "stream", "done"]
