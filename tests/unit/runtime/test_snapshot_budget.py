"""The gateway's budget for paused sessions' snapshots, and each session's cap."""

from __future__ import annotations

import pytest

from kernelgw.runtime.backends.base import PACKAGES_DIR, WORKSPACE_DIR, KernelSpec
from kernelgw.runtime.pause import PausedBudgetExceeded, SnapshotBudget
from kernelgw.runtime.workspace import tree_caps

MiB = 1 << 20


def test_the_budget_is_never_passed_and_bytes_given_back_free_it() -> None:
    seen: list[int] = []
    budget = SnapshotBudget(10 * MiB, on_change=seen.append)
    budget.take(6 * MiB)
    with pytest.raises(PausedBudgetExceeded) as refused:
        budget.take(5 * MiB)  # two pauses at once cannot pass it together
    assert refused.value.status_code == 507 and "paused_budget_mb" in refused.value.message
    assert budget.used == 6 * MiB
    budget.give_back(6 * MiB)
    budget.take(10 * MiB)
    with pytest.raises(PausedBudgetExceeded):
        budget.check()  # full: refused before any work
    assert seen == [6 * MiB, 0, 10 * MiB]


def test_snapshots_found_on_disk_are_counted_even_past_the_limit() -> None:
    budget = SnapshotBudget(1 * MiB)
    budget.hold(3 * MiB)  # left by a previous gateway process with a larger budget
    assert budget.used == 3 * MiB
    with pytest.raises(PausedBudgetExceeded):
        budget.check()
    budget.give_back(5 * MiB)
    assert budget.used == 0


def test_each_part_is_capped_by_its_tmpfs_size_and_room_for_tar_headers() -> None:
    spec = KernelSpec(
        session_id="s",
        image="i",
        memory_mb=512,
        cpus=1,
        pids_limit=64,
        tmp_size_mb=16,
        workspace_size_mb=32,
        shm_size_mb=16,
        packages_size_mb=64,
    )
    assert tree_caps(spec) == {WORKSPACE_DIR: 34 * MiB, PACKAGES_DIR: 68 * MiB}
