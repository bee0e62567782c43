"""Kernel backends: where kernel containers run. Chosen by name, imported lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelgw.runtime.backends.base import Backend, EngineHealth, KernelHandle, KernelSpec, KernelState

if TYPE_CHECKING:
    from kernelgw.config import Settings

__all__ = ["Backend", "EngineHealth", "KernelHandle", "KernelSpec", "KernelState", "create_backend"]


def create_backend(settings: Settings) -> Backend:
    """The Docker backend for these settings (the only one so far)."""
    from kernelgw.config import parse_uid_range
    from kernelgw.runtime.backends.docker import DockerBackend

    return DockerBackend(
        gateway_name=settings.gateway_name,
        runtime_dir=settings.runtime_dir,
        kernel_uid=settings.kernel_uid,
        kernel_gid=settings.kernel_gid,
        kernel_uids=parse_uid_range(settings.kernel_uid_range) if settings.kernel_uid_range else None,
        uid_state_dir=settings.uid_state_dir,
        keep_workspaces=settings.persistent_workspace,
        root_commands=settings.e2b_root_commands,
    )
