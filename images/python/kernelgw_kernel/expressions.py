"""The gateway's two ``user_expressions`` of every cell, answered without
IPython's display formatter.

After each cell the gateway asks the kernel for ``artifacts`` (the workspace
files the cell wrote: a JSON list, :func:`kernelgw_kernel.artifacts`) and
``kernelgw_end`` (the cell's nonce, a quoted string: proof that a reply
answered its request). IPython formats each value with every formatter it has
(text/plain, HTML, Markdown, SVG, PNG, JPEG, LaTeX, JSON, JavaScript, PDF and
the mimebundle hook), which took 60-100 us per expression, in the kernel,
between the cell's result and its reply: about 0.2 ms of every cell that a
plain Jupyter client does not pay. Both values only ever have text/plain (a
str, an ``ArtifactReport``), and for those IPython's text/plain is their
``repr``; so for these two keys, with these expressions and values of these
types, the kernel gives what the formatter would, for a few microseconds
(text/plain only, even where user code registered a formatter of its own for
``str``: the gateway reads nothing else, and takes both keys out of the reply
a Jupyter client is shown). Anything else (another key, another expression, a value of
another type because user code replaced the helper, an exception) goes the
formatter's way as before.
"""

from __future__ import annotations

import re
from typing import Any

ARTIFACTS_KEY = "artifacts"
ARTIFACTS_EXPRESSION = "__import__('kernelgw_kernel').artifacts()"
END_KEY = "kernelgw_end"
_QUOTED = re.compile(r"'[0-9A-Za-z_-]{1,64}'\Z")
"""The gateway's nonces (hex) and its warm-up's ``'warm-up'``."""


def _ours(key: str, expression: Any) -> bool:
    if key == ARTIFACTS_KEY:
        return bool(expression == ARTIFACTS_EXPRESSION)
    return key == END_KEY and isinstance(expression, str) and _QUOTED.match(expression) is not None


def install_fast_expressions(shell: Any) -> None:
    """Answer the gateway's own expressions of ``shell`` as text/plain (once per shell)."""
    if getattr(shell, "kernelgw_fast_expressions", False):
        return
    shell.kernelgw_fast_expressions = True
    formatted = shell.user_expressions

    from kernelgw_kernel import ArtifactReport

    plain_types = (str, ArtifactReport)

    def user_expressions(expressions: dict[str, Any]) -> dict[str, Any]:
        if not any(_ours(key, expression) for key, expression in expressions.items()):
            return formatted(expressions)  # type: ignore[no-any-return]
        out: dict[str, Any] = {}
        for key, expression in expressions.items():  # in order, as IPython evaluates them
            if not _ours(key, expression):
                out.update(formatted({key: expression}))
                continue
            try:
                value = eval(expression, shell.user_global_ns, shell.user_ns)
            except BaseException:
                out[key] = shell._user_obj_error()
                continue
            if type(value) in plain_types:
                out[key] = {"status": "ok", "data": {"text/plain": repr(value)}, "metadata": {}}
            else:
                out[key] = shell._format_user_obj(value)
        return out

    shell.user_expressions = user_expressions
