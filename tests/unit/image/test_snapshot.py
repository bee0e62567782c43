"""Pausing a session, the kernel's half (images/python/kernelgw_kernel/namespace.py):
the user's variables saved from one IPython shell and restored into a fresh one.

Real ``InteractiveShell`` instances run the cells, as in a kernel; no Docker.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from tests.support.local_backend import image_helper

ShellFactory = Callable[[], InteractiveShell]

CELLS = [
    "import json as j\nimport pandas as pd\nfrom os import path",
    "df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})\nnumbers = {'pi': 3.14, 'list': [1, 2, 3]}",
    "counter = 1\ndef bump(by=1):\n    global counter\n    counter += by\n    return counter",
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
    "    def norm2(self):\n        return self.x ** 2 + self.y ** 2\n"
    "    def __eq__(self, other):\n        return (self.x, self.y) == (other.x, other.y)\np = Point(3, 4)",
    "square = lambda x: x * x",
    "fh = open({file!r})\ngen = (i for i in range(3))",
    "_private = 1\nbump();",
]


@pytest.fixture(scope="module")
def namespace() -> Iterator[ModuleType]:
    with image_helper("namespace") as module:
        yield module


@pytest.fixture
def new_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShellFactory]:
    """Fresh shells (not the singleton) with an in-memory history; each puts its
    user module in sys.modules["__main__"], which is put back afterwards."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shells: list[InteractiveShell] = []

    def new() -> InteractiveShell:
        shells.append(InteractiveShell(config=config))
        return shells[-1]

    yield new
    for shell in shells:
        for name in [n for n in shell.user_ns if n in ("fh", "gen")]:
            if hasattr(shell.user_ns[name], "close"):
                shell.user_ns[name].close()
        shell.history_manager.end_session()


def run(shell: InteractiveShell, code: str) -> Any:
    result = shell.run_cell(code, store_history=True)
    result.raise_error()
    return result.result


def ipython_state(shell: InteractiveShell) -> tuple[object, ...]:
    return (shell.execution_count, list(shell.user_ns["In"]), dict(shell.user_ns["Out"]), sorted(shell.user_ns))


def analysis(shell: InteractiveShell, tmp_path: Path) -> InteractiveShell:
    (tmp_path / "data.txt").write_text("hello\n")
    for cell in CELLS:
        run(shell, cell.replace("{file!r}", repr(str(tmp_path / "data.txt"))))
    return shell


def test_a_namespace_round_trips_into_a_fresh_shell(
    namespace: ModuleType, new_shell: ShellFactory, tmp_path: Path
) -> None:
    old = analysis(new_shell(), tmp_path)
    before = ipython_state(old)
    snap = str(tmp_path / "snap")

    saved = namespace.save(snap, 10_000_000, shell=old)

    assert ipython_state(old) == before
    assert saved["saved"] == ["df", "numbers", "counter", "bump", "Point", "p", "square"]
    assert saved["modules"] == {"j": "json", "pd": "pandas", "path": "posixpath"}
    assert saved["failed"] == {
        "fh": "TypeError: cannot pickle '_io.TextIOWrapper' object",
        "gen": "TypeError: cannot pickle 'generator' object",
    }
    assert saved["bytes"] == os.path.getsize(snap)
    assert stat.S_IMODE(os.stat(snap).st_mode) == 0o600
    assert not os.path.exists(snap + ".part")
    assert json.loads(repr(saved)) == saved

    new = new_shell()
    fresh = ipython_state(new)
    restored = namespace.load(snap, shell=new)

    assert restored == {
        "restored": ["df", "numbers", "counter", "bump", "Point", "p", "square"],
        "modules": {"j": "json", "pd": "pandas", "path": "posixpath"},
        "failed": {},
    }
    assert json.loads(repr(restored)) == restored
    assert not os.path.exists(snap)
    execution_count, inputs, outputs, names = fresh
    assert ipython_state(new) == (
        execution_count,
        inputs,
        outputs,
        sorted([*names, *restored["restored"], *restored["modules"]]),
    )
    assert new.user_ns["__builtins__"] is old.user_ns["__builtins__"]

    ns = new.user_ns
    assert ns["df"].equals(old.user_ns["df"])
    assert ns["numbers"] == {"pi": 3.14, "list": [1, 2, 3]}
    assert ns["j"] is json and ns["path"] is os.path
    assert ns["square"](7) == 49
    assert type(ns["p"]) is ns["Point"] and ns["p"] == ns["Point"](3, 4)
    assert ns["p"].norm2() == 25
    # functions defined in cells see, and assign to, the restored namespace
    assert ns["counter"] == 2
    assert run(new, "bump(10)") == 12
    assert ns["counter"] == 12 and ns["bump"].__globals__ is new.user_global_ns
    assert run(new, "df2 = pd.DataFrame({'a': [1]})\nPoint(1, 2).norm2() + len(df2)") == 6


def test_ipython_names_and_hidden_names_stay(namespace: ModuleType, new_shell: ShellFactory, tmp_path: Path) -> None:
    shell = new_shell()
    shell.push({"preloaded": 1, "rebound": 2}, interactive=False)  # what an extension adds
    run(shell, "x = 1\nx")
    run(shell, "_y = 2\nrebound = 3\nIn = In")
    saved = namespace.save(str(tmp_path / "snap"), 1_000_000, shell=shell)
    assert saved == {"saved": ["rebound", "x"], "modules": {}, "failed": {}, "bytes": saved["bytes"]}


def test_the_limit_keeps_what_fits(namespace: ModuleType, new_shell: ShellFactory, tmp_path: Path) -> None:
    shell = new_shell()
    run(shell, "import json\nsmall = 1\nbig = b'x' * 100_000\nafter = 'fits'")
    snap = str(tmp_path / "snap")
    saved = namespace.save(snap, 2_000, shell=shell)
    assert saved["saved"] == ["small", "after"]
    assert saved["modules"] == {"json": "json"}
    assert saved["failed"] == {"big": "the snapshot would pass its limit of 2000 bytes"}
    assert saved["bytes"] == os.path.getsize(snap) <= 2_000

    # the limit is on the file: as close to it as the values allow, never past it
    too_small = namespace.save(str(tmp_path / "none"), 40, shell=shell)
    assert too_small == {
        "saved": [],
        "modules": {},
        "failed": {"*": "the snapshot would pass its limit of 40 bytes"},
        "bytes": 0,
    }
    assert not (tmp_path / "none").exists()
    sizes = {}
    for limit in range(60, 400, 10):
        result = namespace.save(snap, limit, shell=shell)
        assert result["bytes"] == os.path.getsize(snap) <= limit, (limit, result)
        assert sorted([*result["saved"], *result["modules"], *result["failed"]]) == ["after", "big", "json", "small"]
        sizes[limit] = len(result["saved"]) + len(result["modules"])
    assert sizes[60] == 0 and sizes[390] == 3, sizes


def test_a_value_that_cannot_be_restored_is_named(
    namespace: ModuleType, new_shell: ShellFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value of a module the new kernel lacks (a package installed into the
    session only): the others are restored."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "kgw_snapshot_only_here.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    shell = new_shell()
    run(shell, "import kgw_snapshot_only_here as m\nthing = m.Thing()\nkept = [1, 2]")
    snap = str(tmp_path / "snap")
    assert namespace.save(snap, 1_000_000, shell=shell)["saved"] == ["thing", "kept"]
    sys.path.remove(str(tmp_path / "mods"))
    del sys.modules["kgw_snapshot_only_here"]

    new = new_shell()
    restored = namespace.load(snap, shell=new)
    assert restored == {
        "restored": ["kept"],
        "modules": {},
        "failed": {
            "m": "ModuleNotFoundError: No module named 'kgw_snapshot_only_here'",
            "thing": "ModuleNotFoundError: No module named 'kgw_snapshot_only_here'",
        },
    }
    assert new.user_ns["kept"] == [1, 2] and "thing" not in new.user_ns and "m" not in new.user_ns


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "FileNotFoundError: [Errno 2] No such file or directory"),
        (b"not a pickle", "UnpicklingError"),
        (b"", "EOFError: Ran out of input"),
        (b"\x80\x05\x95\x0f\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x07version\x94K\x02s.", "ValueError: not a kernelgw"),
    ],
)
def test_a_file_that_is_not_a_snapshot_fails_as_a_whole(
    namespace: ModuleType, new_shell: ShellFactory, tmp_path: Path, content: bytes | None, reason: str
) -> None:
    snap = tmp_path / "snap"
    if content is not None:
        snap.write_bytes(content)
    shell = new_shell()
    names = sorted(shell.user_ns)
    restored = namespace.load(str(snap), shell=shell)
    assert restored["restored"] == [] and restored["modules"] == {} and list(restored["failed"]) == ["*"]
    assert restored["failed"]["*"].startswith(reason), restored
    assert json.loads(repr(restored)) == restored
    assert sorted(shell.user_ns) == names
    assert snap.exists() == (content is not None)  # left for a look


def test_a_file_that_cannot_be_written_fails_as_a_whole(
    namespace: ModuleType, new_shell: ShellFactory, tmp_path: Path
) -> None:
    shell = new_shell()
    run(shell, "x = 1")
    saved = namespace.save(str(tmp_path / "missing" / "snap"), 1_000_000, shell=shell)
    assert saved["saved"] == [] and saved["bytes"] == 0
    assert saved["failed"]["*"].startswith("FileNotFoundError: ")


def test_the_gateway_calls_it_through_user_expressions(
    namespace: ModuleType, new_shell: ShellFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the kernel's singleton shell, with the expressions the gateway sends; the
    text/plain of each is the JSON summary, and the shell's state is untouched."""
    snap = str(tmp_path / "snap")
    namespace.save(snap, 10_000_000, shell=analysis(new_shell(), tmp_path))

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    try:
        run(shell, "x = 1")
        before = ipython_state(shell)
        expr = f"__import__('kernelgw_kernel.namespace').namespace.load({snap!r})"
        reply = shell.user_expressions({"r": expr})["r"]
        assert reply["status"] == "ok", reply
        restored = json.loads(reply["data"]["text/plain"])
        assert restored["restored"] == ["df", "numbers", "counter", "bump", "Point", "p", "square"]
        added = [*restored["restored"], *restored["modules"]]
        assert ipython_state(shell)[:3] == before[:3]
        assert ipython_state(shell)[3] == sorted([*before[3], *added])

        expr = f"__import__('kernelgw_kernel.namespace').namespace.save({snap!r}, 10_000_000)"
        before = ipython_state(shell)
        reply = shell.user_expressions({"s": expr})["s"]
        assert reply["status"] == "ok", reply
        assert json.loads(reply["data"]["text/plain"])["saved"] == ["x", *restored["restored"]]
        assert ipython_state(shell) == before
    finally:
        shell.history_manager.end_session()
        InteractiveShell.clear_instance()


def test_the_package_keeps_its_snapshot_function(namespace: ModuleType) -> None:
    """The module is not called ``snapshot``: importing it would have replaced the
    package's ``snapshot()``, which the artifacts hook calls before every cell."""
    package = sys.modules["kernelgw_kernel"]
    assert callable(package.snapshot) and not isinstance(package.snapshot, ModuleType)
