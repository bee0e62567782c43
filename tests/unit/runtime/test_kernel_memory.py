"""The kernel keeps no copy of its cells' outputs (kernelgw_kernel.launcher.forget_outputs).

IPython 9 records every cell's stream text, displays and results in
``history_manager.outputs`` for the kernel's life: a kernel printing large
outputs grew until its memory limit killed it. Real ipykernel processes
(tests/support/local_backend.py) run the image's launcher.
"""

from __future__ import annotations

from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import run, stdout

KEPT = (
    "o = get_ipython().history_manager.outputs\n"
    "kept = sum(len(x) for outs in o.values() for h in outs for x in h.bundle.get('stream', [h.bundle]))\n"
    "print(kept)"
)
"""How much the kernel holds of earlier cells' outputs (characters of stream text, plus bundles)."""


async def test_a_kernel_forgets_its_cells_outputs_once_they_end(new_session: SessionFactory) -> None:
    session = await new_session()
    for code in (
        "print('x' * 1_000_000)",
        "import sys; sys.stderr.write('e' * 10_000)",
        "from IPython.display import display, HTML\ndisplay(HTML('<b>chart</b>'))\n6 * 7",
    ):
        assert (await run(session, code))[-1]["status"] == "ok"
    assert stdout(await run(session, KEPT)) == "0\n"
    # and what it printed reached the client whole
    events = await run(session, "print('y' * 300_000)")
    assert sum(len(e["text"]) for e in events if e["type"] == "stream") == 300_001
