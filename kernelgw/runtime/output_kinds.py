"""Which iopub message types each output rule applies to, side by side.

Three rules look at a message's type, and each needs a slightly different
set: keeping them in one place shows how they differ and why.
"""

from __future__ import annotations

UNBOUNDED_OUTPUT = frozenset({"stream", "display_data", "update_display_data", "clear_output"})
"""The iopub messages a cell may send without bound: what the message rate counts
(`OutputRate`). The others come once per request (``status``,
``execute_input``; ``execute_result`` and ``error`` once per cell): a session
running many small cells is not a flood, and counting them paced a loop of
``1+1`` (eight messages a round with a Jupyter client beside it) for a second
after a pool kernel's warm-up, 60-80 ms a cell. Their bytes still count, and
the loop's share (`LoopShare`) bounds what any message costs the gateway."""

CAPPED_OUTPUT = UNBOUNDED_OUTPUT | {"execute_result"}
"""Messages a cell past its output cap drops unread (`CellOutput`); errors are
kept, so the cell still says how it ended."""

LATE_OUTPUT = frozenset({"stream", "display_data", "update_display_data", "execute_result", "error"})
"""Messages that must not come for a cell after its end (reported as a kernel
anomaly). A status may: an idle the gateway stopped waiting for."""
