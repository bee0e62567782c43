"""The shim's pure logic (images/python/kernelgw_kernel/shim.py): arguments,
connection files, and the rewriting of execute requests and replies. The relay
itself runs in tests/integration/languages/test_shim.py."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from jupyter_client.session import Session

from tests.support.local_backend import IMAGE_HELPERS

KEY = b"0123456789abcdef"
ARTIFACTS = "__import__('kernelgw_kernel').artifacts()"


@pytest.fixture(scope="module")
def shim() -> Iterator[ModuleType]:
    sys.path.insert(0, str(IMAGE_HELPERS))
    try:
        yield importlib.import_module("kernelgw_kernel.shim")
    finally:
        sys.path.remove(str(IMAGE_HELPERS))


def frames_of(
    session: Session, msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None = None
) -> list[bytes]:
    msg = session.msg(msg_type, content, parent=parent or {})
    return [b"gateway-ident", *session.serialize(msg)]


def parsed(session: Session, frames: list[bytes]) -> dict[str, Any]:
    i = frames.index(b"<IDS|MSG>")
    msg: dict[str, Any] = session.deserialize(frames[i + 1 :], content=True)  # checks the HMAC
    return msg


def test_argv_substitution_and_options(shim: ModuleType) -> None:
    assert shim.substitute(["deno", "--conn", "{connection_file}", "x={connection_file}"], "/tmp/k.json") == [
        "deno",
        "--conn",
        "/tmp/k.json",
        "x=/tmp/k.json",
    ]
    assert shim.parse_args(["--", "k", "{connection_file}"]) == (
        "tcp",
        "signal",
        "/conn/kernel.json",
        ["k", "{connection_file}"],
    )
    assert shim.parse_args(["--transport=ipc", "--interrupt", "message", "--connection-file", "c.json", "--", "k"]) == (
        "ipc",
        "message",
        "c.json",
        ["k"],
    )
    for bad in (
        [],
        [
            "--",
        ],
        ["--transport", "udp", "--", "k"],
        ["--interrupt"],
        ["--bogus", "--", "k"],
    ):
        with pytest.raises(ValueError):
            shim.parse_args(bad)


def test_private_connection_files(shim: ModuleType, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    front = {"transport": "ipc", "ip": "/conn/k", "key": "k3y", "signature_scheme": "hmac-sha256", "kernel_name": "x"}
    front.update({f"{ch}_port": i + 1 for i, ch in enumerate(shim.CHANNELS)})
    assert shim.addresses(front)["hb"] == "ipc:///conn/k-5"
    directory, tcp = shim.private_connection(front, "tcp")
    assert os.stat(directory).st_mode & 0o777 == 0o700 and directory.startswith(str(tmp_path))
    assert tcp["ip"] == "127.0.0.1" and tcp["key"] == "k3y" and tcp["transport"] == "tcp"
    ports = {tcp[f"{ch}_port"] for ch in shim.CHANNELS}
    assert len(ports) == 5 and all(p > 1024 for p in ports)
    assert shim.addresses(tcp)["shell"] == f"tcp://127.0.0.1:{tcp['shell_port']}"
    directory, ipc = shim.private_connection(front, "ipc")
    assert shim.addresses(ipc)["control"] == f"ipc://{directory}/k-4"


class FakeWorkspace:
    def __init__(self) -> None:
        self.files: dict[str, int] = {}
        self.snapshots = 0

    def snapshot(self) -> dict[str, int]:
        self.snapshots += 1
        return dict(self.files)

    def changes(self, before: dict[str, int], after: dict[str, int]) -> list[dict[str, Any]]:
        return [{"path": p} for p in sorted(after) if before.get(p) != after[p]]


def test_gateway_expressions_are_answered_by_the_shim(shim: ModuleType) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    ws = FakeWorkspace()
    ex = shim.Expressions(shim.Signer(KEY), ws.snapshot, ws.changes)
    expressions = {"artifacts": ARTIFACTS, "kernelgw_end": "'0a1b2c3d'", "mine": "x + 1"}
    request = frames_of(gateway, "execute_request", {"code": "x", "silent": False, "user_expressions": expressions})
    out = ex.request(request)
    assert out[0] == b"gateway-ident"  # routing kept
    msg = parsed(kernel, out)  # re-signed: the kernel accepts it
    assert msg["content"]["user_expressions"] == {"mine": "x + 1"}
    assert msg["content"]["code"] == "x" and msg["header"] == parsed(kernel, request)["header"]
    assert ws.snapshots == 1

    ws.files["out.csv"] = 1
    reply = frames_of(
        kernel,
        "execute_reply",
        {
            "status": "ok",
            "execution_count": 1,
            "user_expressions": {"mine": {"status": "ok", "data": {"text/plain": "2"}}},
        },
        parent=msg["header"],
    )
    answered = parsed(gateway, ex.reply(reply))["content"]["user_expressions"]
    assert answered["mine"]["data"]["text/plain"] == "2"
    assert json.loads(answered["artifacts"]["data"]["text/plain"]) == [{"path": "out.csv"}]
    assert answered["kernelgw_end"] == {"status": "ok", "data": {"text/plain": "'0a1b2c3d'"}, "metadata": {}}
    assert not ex.pending


def test_a_failed_cell_gets_artifacts_but_no_nonce_and_silent_requests_keep_the_snapshot(shim: ModuleType) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    ws = FakeWorkspace()
    ex = shim.Expressions(shim.Signer(KEY), ws.snapshot, ws.changes)
    cell = parsed(
        kernel,
        ex.request(
            frames_of(
                gateway,
                "execute_request",
                {"code": "boom", "silent": False, "user_expressions": {"artifacts": ARTIFACTS, "kernelgw_end": "'n'"}},
            )
        ),
    )
    ws.files["half.txt"] = 1
    error = frames_of(
        kernel,
        "execute_reply",
        {"status": "error", "ename": "E", "evalue": "v", "traceback": []},
        parent=cell["header"],
    )
    content = parsed(gateway, ex.reply(error))["content"]
    assert "kernelgw_end" not in content["user_expressions"]  # as IPython: no nonce for a failed cell
    assert json.loads(content["user_expressions"]["artifacts"]["data"]["text/plain"]) == [{"path": "half.txt"}]
    taken = ws.snapshots
    # the gateway's probe: silent, artifacts only; the workspace is not snapshotted again
    probe = parsed(
        kernel,
        ex.request(
            frames_of(
                gateway, "execute_request", {"code": "", "silent": True, "user_expressions": {"artifacts": ARTIFACTS}}
            )
        ),
    )
    assert ws.snapshots == taken
    answer = ex.reply(
        frames_of(kernel, "execute_reply", {"status": "ok", "user_expressions": {}}, parent=probe["header"])
    )
    items = json.loads(parsed(gateway, answer)["content"]["user_expressions"]["artifacts"]["data"]["text/plain"])
    assert items == [{"path": "half.txt"}]


def test_what_is_not_ours_passes_unchanged(shim: ModuleType) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    ws = FakeWorkspace()
    ex = shim.Expressions(shim.Signer(KEY), ws.snapshot, ws.changes)
    plain = frames_of(gateway, "execute_request", {"code": "1", "silent": False, "user_expressions": {"a": "b"}})
    assert ex.request(plain) is plain
    info = frames_of(gateway, "kernel_info_request", {})
    assert ex.request(info) is info
    # a forged or broken signature, a nonce that is not a plain quoted token, garbage frames
    forged = frames_of(
        Session(key=b"other"), "execute_request", {"code": "1", "user_expressions": {"artifacts": ARTIFACTS}}
    )
    assert ex.request(forged) is forged
    odd = frames_of(gateway, "execute_request", {"code": "1", "user_expressions": {"kernelgw_end": "__import__('os')"}})
    assert ex.request(odd) is odd
    for junk in ([b"x"], [b"<IDS|MSG>", b"sig"], [b"<IDS|MSG>", b"", b"{", b"{}", b"{}", b"{}"]):
        try:
            out = ex.request(junk)
        except ValueError:  # the relay catches this and forwards the frames
            out = junk
        assert out == junk
    # a reply to a request we did not touch
    reply = frames_of(kernel, "execute_reply", {"status": "ok"}, parent={"msg_id": "unknown"})
    assert ex.reply(reply) is reply


def test_the_pending_table_is_bounded(shim: ModuleType) -> None:
    gateway = Session(key=KEY)
    ws = FakeWorkspace()
    ex = shim.Expressions(shim.Signer(KEY), ws.snapshot, ws.changes)
    for _ in range(shim.PENDING_MAX + 10):
        ex.request(
            frames_of(
                gateway, "execute_request", {"code": "", "silent": True, "user_expressions": {"artifacts": ARTIFACTS}}
            )
        )
    assert len(ex.pending) == shim.PENDING_MAX


def test_interrupt_request_is_signed(shim: ModuleType) -> None:
    frames = shim.interrupt_message(shim.Signer(KEY), "abc", 3)
    msg = Session(key=KEY).deserialize(frames[1:], content=True)
    assert msg["header"]["msg_type"] == "interrupt_request" and msg["content"] == {}
    assert msg["header"]["msg_id"].endswith("_3")


def test_exit_status(shim: ModuleType) -> None:
    assert shim.exit_status(0) == 0
    assert shim.exit_status(3 << 8) == 3
    assert shim.exit_status(15) == 143  # killed by SIGTERM
