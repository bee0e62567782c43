"""The kernel answers the gateway's own ``user_expressions`` (``artifacts``,
``kernelgw_end``) without IPython's display formatter
(images/python/kernelgw_kernel/expressions.py): what it answers must be what the
formatter gives, byte for byte, for the same expression under another key.

Real ipykernel processes (tests/support/local_backend.py) run the image's launcher.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kernelgw.runtime.execution import ARTIFACTS_EXPRESSION, ARTIFACTS_KEY, END_KEY
from kernelgw.runtime.session import KernelSession
from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import run, stdout

IMAGE = Path(__file__).resolve().parents[3] / "images" / "python"


async def expressions(session: KernelSession, exprs: dict[str, str]) -> dict[str, Any]:
    reply = await session._link.silent_request("", exprs, timeout=30)
    assert reply is not None and reply.get("status") == "ok", reply
    values = reply["user_expressions"]
    assert list(values) == list(exprs)  # every key, in order
    return values  # type: ignore[no-any-return]


def twins(nonce: str) -> dict[str, str]:
    """Ours, then the same expressions under keys the kernel formats as usual."""
    return {
        ARTIFACTS_KEY: ARTIFACTS_EXPRESSION,
        END_KEY: repr(nonce),
        "artifacts_formatted": ARTIFACTS_EXPRESSION,
        "end_formatted": repr(nonce),
    }


def assert_same_as_formatted(values: dict[str, Any]) -> None:
    assert values[ARTIFACTS_KEY] == values["artifacts_formatted"]
    assert values[END_KEY] == values["end_formatted"]


def test_the_image_and_the_gateway_name_the_same_expressions() -> None:
    sys.path.insert(0, str(IMAGE))
    try:
        from kernelgw_kernel import expressions as image
    finally:
        sys.path.remove(str(IMAGE))
    assert (image.ARTIFACTS_KEY, image.ARTIFACTS_EXPRESSION, image.END_KEY) == (
        ARTIFACTS_KEY,
        ARTIFACTS_EXPRESSION,
        END_KEY,
    )


async def test_the_gateways_expressions_are_answered_as_the_formatter_would(new_session: SessionFactory) -> None:
    session = await new_session()
    assert stdout(await run(session, "print(get_ipython().kernelgw_fast_expressions)")) == "True\n"
    values = await expressions(session, twins("0123456789abcdef"))
    assert values[END_KEY] == {"status": "ok", "data": {"text/plain": "'0123456789abcdef'"}, "metadata": {}}
    assert_same_as_formatted(values)

    # a cell that wrote files: a non-empty report (its files since the cell started)
    await run(session, "open('a.txt', 'w').write('x')\nopen('b.csv', 'w').write('1,2')")
    values = await expressions(session, twins("warm-up"))
    assert "a.txt" in values[ARTIFACTS_KEY]["data"]["text/plain"], values
    assert_same_as_formatted(values)


@pytest.mark.parametrize(
    ("replacement", "status"),
    [
        ("lambda: {'not': 'a report'}", "ok"),  # another type: the formatter's way
        ("lambda: 1 / 0", "error"),  # an exception: IPython's error dict
    ],
)
async def test_user_code_that_replaced_the_helper_gets_what_ipython_gives(
    new_session: SessionFactory, replacement: str, status: str
) -> None:
    session = await new_session()
    await run(session, f"import kernelgw_kernel\nkernelgw_kernel.artifacts = {replacement}")
    values = await expressions(session, twins("feed"))
    assert values[ARTIFACTS_KEY]["status"] == status
    assert_same_as_formatted(values)


async def test_other_expressions_and_other_text_under_our_keys_are_formatted_as_usual(
    new_session: SessionFactory,
) -> None:
    session = await new_session()
    # a str formatter of the user's own: the formatter's answers show it, and so
    # must every expression that is not exactly the gateway's
    await run(session, "get_ipython().display_formatter.formatters['text/html'].for_type(str, lambda s: '<b>' + s)")
    values = await expressions(
        session,
        {
            END_KEY: "'two words'",  # not a nonce
            ARTIFACTS_KEY: "'artifacts'",  # not the helper
            "mine": "'x'",
        },
    )
    for key, text in ((END_KEY, "two words"), (ARTIFACTS_KEY, "artifacts"), ("mine", "x")):
        assert values[key]["data"] == {"text/plain": repr(text), "text/html": f"<b>{text}"}, values
    # ours, exactly: text/plain only, as the gateway reads it
    values = await expressions(session, {END_KEY: "'c0ffee'"})
    assert values[END_KEY]["data"] == {"text/plain": "'c0ffee'"}
