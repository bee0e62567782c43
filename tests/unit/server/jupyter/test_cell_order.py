"""A client's answers leave in the order its cells were sent (pure logic, no kernel)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kernelgw.server.jupyter import wire
from kernelgw.server.jupyter.cells import ClientCells


class Owner:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.on_send: Callable[[], None] = lambda: None

    def send_kernel(self, channel: str, msg: dict[str, Any]) -> None:
        self.sent.append((channel, msg))
        self.on_send()


def request(msg_id: str) -> wire.ClientMessage:
    header = {"msg_id": msg_id, "msg_type": "execute_request", "session": "s", "username": "u", "version": "5.3"}
    return wire.ClientMessage("shell", header, {}, {}, {"code": "x"})


def failed_reply(msg_id: str) -> SimpleNamespace:
    """How the queue ends a cell the kernel answered with an error (its idle not yet read)."""
    reply = {
        "header": {"msg_id": "r", "msg_type": "execute_reply"},
        "parent_header": {"msg_id": msg_id},
        "content": {"status": "error"},
    }
    return SimpleNamespace(
        reply_msg=reply, reply=reply["content"], reply_order=5, reply_verified=True, ending=None, injected=()
    )


def never_ran() -> SimpleNamespace:
    return SimpleNamespace(reply_msg=None, reply=None, reply_order=None, reply_verified=False, ending=None, injected=())


def replies(owner: Owner) -> list[tuple[str, str]]:
    return [
        (m["parent_header"]["msg_id"] if "parent_header" in m else m["header"]["msg_id"], m["content"]["status"])
        for ch, m in owner.sent
        if ch == "shell"
    ]


async def test_a_cell_aborted_behind_a_failed_one_is_answered_after_it() -> None:
    owner = Owner()
    cells = ClientCells(owner, "s")
    first, second = cells.new(request("one")), cells.new(request("two"))
    first.ended(failed_reply("one"))  # waits for the kernel's idle on the connection
    assert second.should_abort()
    second.ended(never_ran())
    assert replies(owner) == []  # not before the failed cell's own reply
    cells.idle("one", {"header": {"msg_id": "k_1_6"}, "parent_header": {"msg_id": "one"}, "metadata": {}})
    assert [status for _, status in replies(owner)] == ["error", "aborted"]
    assert not cells.waiting


async def test_the_idle_wait_running_out_releases_the_later_answers_too(monkeypatch: Any) -> None:
    from kernelgw.server.jupyter import cells as cells_module

    monkeypatch.setattr(cells_module, "IDLE_WAIT_S", 0.01)
    owner = Owner()
    cells = ClientCells(owner, "s")
    first, second = cells.new(request("one")), cells.new(request("two"))
    first.ended(failed_reply("one"))
    second.should_abort()
    second.ended(never_ran())
    released = asyncio.Event()
    owner.on_send = released.set
    if len(replies(owner)) < 2:
        await asyncio.wait_for(released.wait(), 30)
    assert [status for _, status in replies(owner)] == ["error", "aborted"]
