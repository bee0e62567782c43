"""Environment variables for one cell of a Python kernel (E2B's per-execution ``env_vars``).

The queue's worker runs `setter_code` as a silent request right before the cell,
on the same socket: the kernel then sets the variables, and an IPython
``post_run_cell`` hook, registered first, puts back what was there before (or
removes them) once the cell is over, whether it ended well, raised or was
interrupted. Silent requests fire no ``post_run_cell``, so the hook runs after
the cell itself and nothing else: the next cell, whoever sends it, never sees
them. The user's code is sent as it was written (its line numbers and recorded
text unchanged), and the values are in no record.
"""

from __future__ import annotations

_SETTER = """\
import os
from IPython import get_ipython
ip = get_ipython()
saved = {name: os.environ.get(name) for name in ENV}
def restore(*_):
    ip.events.unregister("post_run_cell", restore)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
ip.events.register("post_run_cell", restore)
os.environ.update(ENV)
"""
"""Registers the restore before it sets anything: an interrupt in between leaves
nothing set that is not put back."""


def setter_code(env: dict[str, str]) -> str:
    """The silent request that sets ``env`` for the next cell only. Its own names
    live in a namespace of their own (``exec`` with fresh globals), not the user's."""
    return f"exec({_SETTER!r}, {{'ENV': {env!r}}})"
