"""The shim's pure logic (images/python/kernelgw_kernel/shim.py): arguments,
connection files, and the rewriting of execute requests and replies. The relay
itself runs in tests/integration/languages/test_shim.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from jupyter_client.session import Session

from tests.support.local_backend import image_helper

KEY = b"0123456789abcdef"
ARTIFACTS = "__import__('kernelgw_kernel').artifacts()"


@pytest.fixture(scope="module")
def shim() -> Iterator[ModuleType]:
    with image_helper("shim") as module:
        yield module


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
        "",
        ["k", "{connection_file}"],
        "always",
    )
    options = ["--transport=ipc", "--interrupt", "message", "--connection-file", "c.json", "--fence", "p('{marker}')"]
    assert shim.parse_args([*options, "--", "k"]) == ("ipc", "message", "c.json", "p('{marker}')", ["k"], "always")
    assert shim.parse_args([*options, "--fence-when", "interrupted", "--", "k"]).fence_when == "interrupted"
    bad_args: list[list[str]] = [
        [],
        ["--"],
        ["--transport", "udp", "--", "k"],
        ["--interrupt"],
        ["--bogus", "--", "k"],
        ["--fence", "print()", "--", "k"],
        ["--fence-when", "sometimes", "--", "k"],
    ]
    for bad in bad_args:
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


@pytest.mark.parametrize(
    ("reply", "evalue"),
    [
        (
            {"status": "error", "ename": "Error", "evalue": "Execution failed", "traceback": []},
            "Error: Execution failed",
        ),
        ({"status": "abort"}, "interrupted"),
    ],
)
def test_a_cell_the_shim_interrupted_fails_as_a_keyboard_interrupt(
    shim: ModuleType, reply: dict[str, object], evalue: str
) -> None:
    """The gateway tells an interrupted cell from a failed one by Python's
    ``KeyboardInterrupt``; kernels interrupted by message name it their own way.
    Only the cell running when the interrupt went out; the next one is itself."""
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    ws = FakeWorkspace()
    ex = shim.Expressions(shim.Signer(KEY), ws.snapshot, ws.changes)

    def cell(interrupt: bool) -> dict[str, object]:
        request = frames_of(
            gateway, "execute_request", {"code": "loop", "silent": False, "user_expressions": {"artifacts": ARTIFACTS}}
        )
        header = parsed(kernel, ex.request(request))["header"]
        if interrupt:
            ex.interrupted = True  # what Shim.interrupt sets (message mode) while the cell runs
        return parsed(gateway, ex.reply(frames_of(kernel, "execute_reply", dict(reply), parent=header)))["content"]

    first = cell(interrupt=True)
    assert first["status"] == "error" and first["ename"] == "KeyboardInterrupt" and first["evalue"] == evalue
    assert cell(interrupt=False)["status"] == reply["status"]  # the next cell is itself again


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


def test_routes_put_the_gateways_identities_back(shim: ModuleType) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    routes = shim.Routes()
    request = [b"proxy", *frames_of(gateway, "execute_request", {"code": "input()"})]
    to_kernel = routes.inbound(request)
    assert to_kernel[0] == b"<IDS|MSG>"  # the kernel sees no identity of ours
    header = parsed(kernel, to_kernel)["header"]
    # stdin: routed by the cell's msg_id, and more than once
    ask = kernel.serialize(kernel.msg("input_request", {"prompt": ""}, parent=header))
    for _ in range(2):
        assert routes.outbound(ask, "stdin") == [b"proxy", b"gateway-ident", *ask]
    reply = kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=header))
    assert routes.outbound(reply, "shell") == [b"proxy", b"gateway-ident", *reply]
    assert routes.outbound(reply, "shell") is None  # answered once; a second cannot be routed
    assert routes.outbound([b"junk"], "shell") is None
    unknown = kernel.serialize(kernel.msg("execute_reply", {}, parent={"msg_id": "nope"}))
    assert routes.outbound(unknown, "control") is None
    # the heartbeat: REQ envelopes wait in order
    assert routes.ping([b"a", b"", b"ping1"]) == [b"", b"ping1"]
    assert routes.ping([b"b", b"", b"ping2"]) == [b"", b"ping2"]
    assert routes.pong([b"", b"ping1"]) == [b"a", b"", b"ping1"]
    assert routes.pong([b"", b"ping2"]) == [b"b", b"", b"ping2"]
    assert routes.pong([b"", b"stray"]) is None


def test_routes_are_bounded(shim: ModuleType) -> None:
    gateway = Session(key=KEY)
    routes = shim.Routes(limit=10)
    for _ in range(25):
        routes.inbound(frames_of(gateway, "kernel_info_request", {}))
    assert len(routes.by_msg_id) == 10


def pub(session: Session, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> list[bytes]:
    return [b"kernel.topic", *session.serialize(session.msg(msg_type, content, parent=parent))]


def test_a_fence_puts_the_idle_after_late_output(shim: ModuleType) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    fences = shim.Fences(shim.Signer(KEY), 'console.log("{marker}")', "s1")
    request = gateway.serialize(gateway.msg("execute_request", {"code": "x", "silent": False}))
    cell = parsed(kernel, request)["header"]
    fences.request(request)
    # the cell's reply goes on, and a probe goes to the kernel
    assert not fences.reply(kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=cell)))
    (probe,) = fences.take_probes()
    assert fences.take_probes() == []  # sent once
    probe_msg = kernel.deserialize(probe[1:], content=True)  # signed
    assert probe_msg["content"]["silent"] and probe_msg["content"]["code"].startswith('console.log("kernelgw-fence-s1-')
    marker = probe_msg["content"]["code"][len('console.log("') : -2]
    probe_header = probe_msg["header"]
    stream = pub(kernel, "stream", {"name": "stdout", "text": "early\n"}, cell)
    assert fences.iopub(stream) == [stream]
    idle = pub(kernel, "status", {"execution_state": "idle"}, cell)
    assert fences.iopub(idle) == []  # held
    assert fences.iopub(pub(kernel, "status", {"execution_state": "busy"}, probe_header)) == []
    assert fences.iopub(pub(kernel, "execute_input", {"code": "", "execution_count": 1}, probe_header)) == []
    late = fences.iopub(pub(kernel, "stream", {"name": "stderr", "text": "late\n"}, probe_header))
    (moved,) = late
    moved_msg = parsed(gateway, moved)  # re-signed
    assert moved_msg["parent_header"]["msg_id"] == cell["msg_id"] and moved_msg["content"]["text"] == "late\n"
    other = pub(kernel, "status", {"execution_state": "busy"}, {"msg_id": "next"})
    assert fences.iopub(other) == []  # waits behind the cell's idle
    assert fences.iopub(pub(kernel, "display_data", {"data": {}}, cell)) != []  # the cell's own: on
    assert fences.deadline is not None
    out = fences.iopub(pub(kernel, "stream", {"name": "stdout", "text": f"tail\n{marker}\n"}, probe_header))
    assert len(out) == 3 and out[1:] == [idle, other]
    assert parsed(gateway, out[0])["content"]["text"] == "tail\n"
    assert fences.deadline is None
    # the probe's late idle and reply are dropped; others pass
    assert fences.iopub(pub(kernel, "status", {"execution_state": "idle"}, probe_header)) == []
    probe_reply = kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=probe_header))
    assert fences.reply(probe_reply) is True and fences.take_probes() == []
    assert fences.iopub(other) == [other]


def test_with_fence_when_interrupted_only_an_interrupted_cell_is_fenced(shim: ModuleType) -> None:
    """JJava and IRkernel publish what an interrupted printing loop left in their
    buffers under the next request: the probe's, so the interrupted cell's."""
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    fences = shim.Fences(shim.Signer(KEY), "p('{marker}')", "s9", only_interrupted=True)

    def cell_of(code: str) -> dict[str, Any]:
        request = gateway.serialize(gateway.msg("execute_request", {"code": code, "silent": False}))
        fences.request(request)
        return parsed(kernel, request)["header"]

    # a cell nobody interrupted: its reply and idle go on, no probe
    plain = cell_of("1")
    assert not fences.reply(kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=plain)))
    assert fences.take_probes() == [] and fences.deadline is None
    idle = pub(kernel, "status", {"execution_state": "idle"}, plain)
    assert fences.iopub(idle) == [idle]
    # an idle that overtakes the reply of a cell nobody interrupted goes on too
    early = cell_of("2")
    early_idle = pub(kernel, "status", {"execution_state": "idle"}, early)
    assert fences.iopub(early_idle) == [early_idle] and fences.take_probes() == []
    # an interrupted cell is fenced: the loop's leftover line is its own
    looping = cell_of("repeat print('x')")
    fences.interrupted_cell(looping["msg_id"])
    error_reply = {"status": "error", "ename": "KeyboardInterrupt"}
    assert not fences.reply(kernel.serialize(kernel.msg("execute_reply", error_reply, parent=looping)))
    (probe,) = fences.take_probes()
    probe_msg = kernel.deserialize(probe[1:], content=True)
    marker = probe_msg["content"]["code"][len("p('") : -2]
    looping_idle = pub(kernel, "status", {"execution_state": "idle"}, looping)
    assert fences.iopub(looping_idle) == []
    leftover = pub(kernel, "stream", {"name": "stdout", "text": f"x\n{marker}\n"}, probe_msg["header"])
    moved, released = fences.iopub(leftover)
    moved_msg = parsed(gateway, moved)
    assert moved_msg["parent_header"]["msg_id"] == looping["msg_id"]
    assert moved_msg["content"]["text"] == "x\n" and released == looping_idle
    # the next cell is not fenced again
    after = cell_of("3")
    assert not fences.reply(kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=after)))
    assert fences.take_probes() == []


def test_a_fence_ends_on_its_marker_alone_or_when_finished(shim: ModuleType) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    fences = shim.Fences(shim.Signer(KEY), "print('{marker}')", "s2")
    for _ in range(2):
        request = gateway.serialize(gateway.msg("execute_request", {"code": "x", "silent": False}))
        cell = parsed(kernel, request)["header"]
        fences.request(request)
        fences.reply(kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=cell)))
        (probe,) = fences.take_probes()
        probe_msg = kernel.deserialize(probe[1:], content=True)
        marker = probe_msg["content"]["code"][len("print('") : -2]
        idle = pub(kernel, "status", {"execution_state": "idle"}, cell)
        assert fences.iopub(idle) == []
        if marker.endswith("-1"):
            marker_only = pub(kernel, "stream", {"name": "stdout", "text": marker + "\n"}, probe_msg["header"])
            assert fences.iopub(marker_only) == [idle]
        else:
            assert fences.finish() == [idle]  # the timeout's end
    # silent requests and replies of unknown requests are left alone
    silent = gateway.serialize(gateway.msg("execute_request", {"code": "", "silent": True}))
    fences.request(silent)
    reply = kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=parsed(kernel, silent)["header"]))
    assert fences.reply(reply) is False and fences.take_probes() == []


def probe_of(kernel: Session, fences: Any) -> tuple[dict[str, Any], str]:
    """The one probe the fences want sent, and its marker (template ``p('{marker}')``)."""
    (probe,) = fences.take_probes()
    msg = kernel.deserialize(probe[1:], content=True)
    return msg["header"], msg["content"]["code"][len("p('") : -2]


def test_an_idle_that_overtakes_the_reply_starts_the_fence(shim: ModuleType) -> None:
    """Deno sends the reply (shell) and then the idle (iopub), but they travel
    on different sockets and the idle often reaches the shim first (a cell in
    ten): that idle must wait for the cell's late output all the same."""
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    fences = shim.Fences(shim.Signer(KEY), "p('{marker}')", "s3")
    request = gateway.serialize(gateway.msg("execute_request", {"code": "x", "silent": False}))
    cell = parsed(kernel, request)["header"]
    fences.request(request)
    early = pub(kernel, "stream", {"name": "stdout", "text": "0\n"}, cell)
    assert fences.iopub(early) == [early]
    idle = pub(kernel, "status", {"execution_state": "idle"}, cell)
    assert fences.iopub(idle) == []  # held: the fence starts here
    probe_header, marker = probe_of(kernel, fences)
    assert fences.deadline is not None
    # the reply comes after: it goes on, and starts no second fence
    assert not fences.reply(kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=cell)))
    assert fences.take_probes() == []
    late = fences.iopub(pub(kernel, "stream", {"name": "stdout", "text": "1\n"}, probe_header))
    assert [parsed(gateway, m)["content"]["text"] for m in late] == ["1\n"]
    assert fences.iopub(pub(kernel, "stream", {"name": "stdout", "text": marker + "\n"}, probe_header)) == [idle]
    assert fences.deadline is None
    # a cell's idle after its fence ended passes (it is not fenced twice)
    assert fences.iopub(idle) == [idle] and fences.take_probes() == []


def test_a_cell_idle_that_waited_behind_a_fence_starts_its_own(shim: ModuleType) -> None:
    """Cells sent back to back (a notebook's run-all): the next cell's idle
    waits behind the first one's fence, then fences its own cell."""
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    fences = shim.Fences(shim.Signer(KEY), "p('{marker}')", "s4")
    requests = [gateway.serialize(gateway.msg("execute_request", {"code": c, "silent": False})) for c in "ab"]
    first, second = (parsed(kernel, r)["header"] for r in requests)
    for r in requests:
        fences.request(r)
    first_idle = pub(kernel, "status", {"execution_state": "idle"}, first)
    assert fences.iopub(first_idle) == []
    probe1, marker1 = probe_of(kernel, fences)
    second_out = pub(kernel, "stream", {"name": "stdout", "text": "b\n"}, second)
    second_idle = pub(kernel, "status", {"execution_state": "idle"}, second)
    assert fences.iopub(second_out) == [] and fences.iopub(second_idle) == []  # wait behind the first
    # the second cell's reply, while the first fence is on, starts nothing
    assert not fences.reply(kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=second)))
    assert fences.take_probes() == []
    out = fences.iopub(pub(kernel, "stream", {"name": "stdout", "text": marker1 + "\n"}, probe1))
    assert out == [first_idle, second_out]  # the second idle is held again, by its own fence
    probe2, marker2 = probe_of(kernel, fences)
    assert probe2["msg_id"] != probe1["msg_id"]
    assert fences.iopub(pub(kernel, "stream", {"name": "stdout", "text": marker2}, probe2)) == [second_idle]


def test_a_probe_that_failed_ends_its_fence_at_once(shim: ModuleType) -> None:
    """A probe that did not run (Deno aborts what follows an interrupt) prints no
    marker: its failed reply ends the fence now, not at the timeout, so what
    waits behind it (the next cell's output) is not held back."""
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    fences = shim.Fences(shim.Signer(KEY), "p('{marker}')", "s5")
    request = gateway.serialize(gateway.msg("execute_request", {"code": "x", "silent": False}))
    cell = parsed(kernel, request)["header"]
    fences.request(request)
    assert not fences.reply(kernel.serialize(kernel.msg("execute_reply", {"status": "error"}, parent=cell)))
    probe, _ = probe_of(kernel, fences)
    idle = pub(kernel, "status", {"execution_state": "idle"}, cell)
    assert fences.iopub(idle) == []
    deadline = fences.deadline
    assert deadline is not None and deadline > time.monotonic() + 1
    ok = kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=probe))
    assert fences.reply(ok) is True and fences.deadline == deadline  # an ok probe's marker is still to come
    failed = kernel.serialize(kernel.msg("execute_reply", {"status": "error", "ename": "Error"}, parent=probe))
    assert fences.reply(failed) is True  # dropped, as any probe's reply
    assert fences.deadline is not None and fences.deadline <= time.monotonic()
    assert fences.finish() == [idle]


def test_a_cell_has_started_once_the_kernel_says_so_for_it(shim: ModuleType) -> None:
    """A SIGINT for a cell whose request the kernel has not begun to run waits
    for its start (Shim.interrupt): one that lands in the kernel's handling of
    the request killed or hung IRkernel. The start is the cell's execute_input
    or first output, for that cell only, once."""
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    ws = FakeWorkspace()
    ex = shim.Expressions(shim.Signer(KEY), ws.snapshot, ws.changes)
    request = frames_of(gateway, "execute_request", {"code": "x", "silent": False, "user_expressions": {}})
    header = parsed(kernel, ex.request(request))["header"]
    assert ex.running == header["msg_id"] and not ex.started
    other = frames_of(kernel, "execute_input", {"code": "y"}, parent={"msg_id": "someone-else"})
    busy = frames_of(kernel, "status", {"execution_state": "busy"}, parent=header)
    assert not ex.started_by(other) and not ex.started_by(busy) and not ex.started
    started = frames_of(kernel, "execute_input", {"code": "x", "execution_count": 1}, parent=header)
    assert ex.started_by(started) and ex.started
    output = frames_of(kernel, "stream", {"name": "stdout", "text": "1"}, parent=header)
    assert not ex.started_by(output)  # once
    ex.reply(frames_of(kernel, "execute_reply", {"status": "ok", "execution_count": 1}, parent=header))
    assert ex.running is None and not ex.started_by(started)


def test_the_languages_harness_waits_for_the_shims_own_words(shim: ModuleType) -> None:
    from tests.integration.languages import NOT_PASSED_ON

    assert NOT_PASSED_ON in shim.NOT_PASSED_ON
