"""What the channels accept from a client: what Jupyter Server accepts (an empty or
missing ``header.session``, no ``msg_id``, no channel), refusing only what the
gateway cannot relay safely (no ``msg_type``, a request type it does not allow,
over-long or non-string header fields)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernelgw.server.jupyter import wire


def frame(header: dict[str, Any], **extra: Any) -> str:
    msg: dict[str, Any] = {"channel": "shell", "header": header, "parent_header": {}, "metadata": {}, "content": {}}
    msg.update(extra)
    return json.dumps(msg)


def test_an_empty_session_as_enterprise_gateway_sends_it_is_taken_as_it_is() -> None:
    header = {"username": "", "version": "5.0", "session": "", "msg_id": "a1", "msg_type": "execute_request"}
    msg = wire.parse_text(frame(header, buffers={}, content={"code": "1"}))
    assert msg.header["session"] == "" and msg.msg_id == "a1" and msg.header["version"] == "5.0"


def test_a_header_with_only_msg_type_gets_a_fresh_msg_id_and_defaults() -> None:
    one = wire.parse_text(frame({"msg_type": "kernel_info_request"}))
    two = wire.parse_text(frame({"msg_type": "kernel_info_request", "msg_id": "", "session": None}))
    assert one.msg_id and two.msg_id and one.msg_id != two.msg_id
    assert one.header["session"] == two.header["session"] == ""
    assert one.header["username"] == "" and one.header["version"] == "5.3"


def test_no_channel_means_shell_and_missing_parts_are_empty() -> None:
    msg = wire.parse_text(json.dumps({"header": {"msg_type": "execute_request", "msg_id": "m"}}))
    assert (msg.channel, msg.parent_header, msg.metadata, msg.content) == ("shell", {}, {}, {})


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ({"msg_id": "m", "session": ""}, "header.msg_type"),
        ({"msg_type": "", "msg_id": "m"}, "header.msg_type"),
        ({"msg_type": "shutdown_request", "msg_id": "m"}, "not accepted on the shell channel"),
        ({"msg_type": "execute_request", "msg_id": 5}, "header.msg_id"),
        ({"msg_type": "execute_request", "msg_id": "m" * 257}, "header.msg_id"),
        ({"msg_type": "execute_request", "session": 7}, "header.session"),
        ({"msg_type": "execute_request", "session": "s" * 257}, "header.session"),
    ],
)
def test_what_the_gateway_relies_on_is_still_checked(header: dict[str, Any], why: str) -> None:
    with pytest.raises(wire.WireError, match=why):
        wire.parse_text(frame(header))


def test_a_binary_v1_frame_with_an_empty_session_is_taken() -> None:
    from jupyter_server.services.kernels.connection.base import serialize_msg_to_ws_v1

    header = {"msg_id": "b1", "msg_type": "kernel_info_request", "session": "", "username": "", "version": "5.3"}
    parts = [json.dumps(part).encode() for part in (header, {}, {}, {})]
    data = serialize_msg_to_ws_v1(parts, "shell")
    msg = wire.parse_v1(data)
    assert msg.msg_id == "b1" and msg.header["session"] == ""
