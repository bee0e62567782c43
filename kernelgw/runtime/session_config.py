"""The limits and timeouts one kernel session runs with (set by the manager)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SessionConfig:
    exec_timeout_s: float
    max_exec_timeout_s: float
    interrupt_grace_s: float
    kernel_start_timeout_s: float
    max_output_bytes: int
    replay_buffer: int
    subscriber_queue: int
    state_poll_s: float
    subscriber_max_bytes: int = 64 * 1024 * 1024
    replay_buffer_bytes: int = 4 * 1024 * 1024
    max_image_bytes: int = 8 * 1024 * 1024
    max_message_bytes: int = 64 * 1024 * 1024
    auto_replay: bool = False
    """Restart and replay the kernel's cells after it dies under a cell (out of
    memory) or is restarted after ignoring a timeout (`kernelgw.runtime.lineage`)."""
