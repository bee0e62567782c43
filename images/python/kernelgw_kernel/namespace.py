"""Save the user's variables to one file and restore them in a fresh kernel:
the kernel's half of pausing a session.

The gateway evaluates these as user_expressions of an execute request, so
nothing is bound in the user's namespace and nothing is printed::

    __import__('kernelgw_kernel.namespace').namespace.save('/tmp/kernelgw-snapshot', 268435456)
    __import__('kernelgw_kernel.namespace').namespace.load('/tmp/kernelgw-snapshot')

(Not ``kernelgw_kernel.snapshot``: importing a submodule binds its name in the
package, and the package's own ``snapshot()`` function, which the artifacts
hook calls before every cell, would be replaced by it.)

Each answers a :class:`Summary`, whose ``text/plain`` is JSON::

    save: {"saved": [name], "modules": {name: module}, "failed": {name: reason}, "bytes": size}
    load: {"restored": [name], "modules": {name: module}, "failed": {name: reason}}

A reason of the name ``"*"`` means the whole file failed (it could not be
written, read or parsed).

What is saved: every name of ``user_ns`` except IPython's own (anything
starting with ``_``, ``In``, ``Out``, ``exit``, ``quit``, ``get_ipython``, and
whatever IPython or an extension put in ``user_ns_hidden`` while the user has
not rebound it). A module is recorded by its name and imported again on load.
Every other value is pickled on its own with cloudpickle, so one that cannot be
pickled (an open file, a generator, a lock) is reported by name and the others
are saved. Functions and classes defined in cells are pickled by value; their
global namespace is pickled as a reference to the user's namespace and is the
new kernel's ``user_ns`` once restored, so they see (and ``global`` assigns to)
the restored variables rather than private copies of them.

The file is a plain pickle of ``{"version": 1, "modules": {name: module},
"values": {name: cloudpickle bytes}}``, written to ``path + ".part"`` with mode
0600 and renamed. The gateway never unpickles it (it treats the file as
opaque bytes and reads only the summary): only :func:`load`, in the user's own
kernel container, does.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import types
from collections import ChainMap
from collections.abc import Iterator
from typing import Any, ClassVar

import cloudpickle

VERSION = 1
PROTOCOL = 5
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
"""Never saved, even when the user rebound them (the underscore names are
skipped by their prefix)."""
NAMESPACE_ID = "user_ns"
"""The persistent id of the user's namespace in the pickled values."""
ENTRY_OVERHEAD = 32
"""An upper bound of the bytes one entry of ``values`` or ``modules`` adds to the
file besides its name and data (pickle opcodes, memo and frame headers)."""
MAX_REASON = 200


class Summary(dict[str, Any]):
    """What :func:`save` and :func:`load` return; its repr is the JSON the gateway reads."""

    def __repr__(self) -> str:
        return json.dumps(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


class _OverLimit(Exception):
    pass


class _Limited:
    """A pickler's output in memory, refused once it passes ``limit`` bytes, so a
    value too large for the snapshot is not pickled in full."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = io.BytesIO()

    def write(self, data: Any) -> int:
        n = self.buffer.write(data)
        if self.buffer.tell() > self.limit:
            raise _OverLimit
        return n


def _refuse(obj: Any) -> Any:
    """Pickle's own answer for an open text file ("cannot pickle
    '_io.TextIOWrapper' object"). cloudpickle would read all of a file open for
    reading into a StringIO that stands in for it after the load."""
    return obj.__reduce_ex__(PROTOCOL)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, but a function whose globals are the user's namespace keeps
    that namespace (by reference) instead of a copy of the globals it uses, and
    open files are refused."""

    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {io.TextIOWrapper: _refuse}, cloudpickle.Pickler.dispatch_table
    )

    def __init__(self, file: Any, namespace: dict[str, Any]) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self.namespace = namespace

    def persistent_id(self, obj: Any) -> str | None:
        return NAMESPACE_ID if obj is self.namespace else None

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        reduced = super()._dynamic_function_reduce(func)
        if func.__globals__ is not self.namespace:
            return reduced
        try:
            make, (code, _, name, argdefs, closure), (attrs, slots), *rest = reduced
            if "__globals__" not in slots:
                return reduced
        except (TypeError, ValueError):
            return reduced  # another cloudpickle: its own (copied) globals then
        return (make, (code, self.namespace, name, argdefs, closure), (attrs, {**slots, "__globals__": {}}), *rest)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, namespace: dict[str, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.namespace = namespace

    def persistent_load(self, pid: Any) -> Any:
        if pid == NAMESPACE_ID:
            return self.namespace
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _shell(shell: Any) -> Any:
    if shell is not None:
        return shell
    from IPython import get_ipython  # in the kernel already imported

    found = get_ipython()
    if found is None:
        raise RuntimeError("kernelgw_kernel.namespace runs inside an IPython kernel")
    return found


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def user_variables(shell: Any) -> Iterator[tuple[str, Any]]:
    """The user's names and values, in the order they were first bound."""
    hidden = shell.user_ns_hidden
    missing = object()
    for name, value in list(shell.user_ns.items()):
        if not isinstance(name, str) or name.startswith("_") or name in IPYTHON_NAMES:
            continue
        if hidden.get(name, missing) is value:
            continue
        yield name, value


def _entry_size(*names: str) -> int:
    return ENTRY_OVERHEAD + sum(len(n.encode("utf-8", "surrogatepass")) for n in names)


def _write(path: str, content: dict[str, Any]) -> int:
    """Pickle ``content`` into ``path`` (mode 0600) by way of ``path + ".part"``;
    returns the file's size."""
    part = path + ".part"
    try:
        with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # an old .part keeps its mode through O_CREAT
            pickle.dump(content, f, protocol=PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return size


def save(path: str, max_bytes: int, *, shell: Any = None) -> Summary:
    """Pickle the user's variables into ``path`` (at most ``max_bytes`` bytes).

    Returns ``{"saved", "modules", "failed", "bytes"}``. A value that cannot be
    pickled, or would make the file pass ``max_bytes``, is in ``failed`` with
    the reason; the values after it are still tried. When the file cannot be
    written (or even an empty snapshot would pass ``max_bytes``), nothing is
    saved and ``failed`` is ``{"*": reason}``.
    ``shell`` is the kernel's IPython shell unless a test passes its own.
    """
    shell = _shell(shell)
    limit_reason = f"the snapshot would pass its limit of {max_bytes} bytes"
    modules: dict[str, str] = {}
    values: dict[str, bytes] = {}
    failed: dict[str, str] = {}
    size = len(pickle.dumps({"version": VERSION, "modules": {}, "values": {}}, protocol=PROTOCOL))
    if size > max_bytes:
        return Summary(saved=[], modules={}, failed={"*": limit_reason}, bytes=0)
    variables = list(user_variables(shell))
    for name, value in variables:  # modules first: a few bytes each
        if isinstance(value, types.ModuleType):
            entry = _entry_size(name, value.__name__)
            if size + entry > max_bytes:
                failed[name] = limit_reason
            else:
                modules[name] = value.__name__
                size += entry
    for name, value in variables:
        if isinstance(value, types.ModuleType):
            continue
        room = max_bytes - size - _entry_size(name)
        if room < 0:
            failed[name] = limit_reason
            continue
        out = _Limited(room)
        try:
            _Pickler(out, shell.user_global_ns).dump(value)
        except _OverLimit:
            failed[name] = limit_reason
            continue
        except Exception as exc:
            failed[name] = _reason(exc)
            continue
        values[name] = out.buffer.getvalue()
        size += _entry_size(name) + len(values[name])
    try:
        written = _write(path, {"version": VERSION, "modules": modules, "values": values})
    except Exception as exc:
        return Summary(saved=[], modules={}, failed={"*": _reason(exc)}, bytes=0)
    return Summary(saved=list(values), modules=modules, failed=failed, bytes=written)


def _read(path: str) -> tuple[dict[str, str], dict[str, bytes]]:
    with open(path, "rb") as f:
        content = pickle.load(f)
    if not isinstance(content, dict) or content.get("version") != VERSION:
        version = content.get("version") if isinstance(content, dict) else None
        raise ValueError(f"not a kernelgw snapshot of version {VERSION} (version {version!r})")
    modules, values = content.get("modules"), content.get("values")
    if not isinstance(modules, dict) or not isinstance(values, dict):
        raise ValueError("a kernelgw snapshot without its modules or values")
    return modules, values


def load(path: str, *, shell: Any = None) -> Summary:
    """Restore the variables :func:`save` wrote to ``path`` into the user's
    namespace, then delete the file.

    Returns ``{"restored", "modules", "failed"}``; a value or module that
    cannot be restored is in ``failed`` with the reason. Never raises: a file
    that cannot be read or is not a snapshot gives ``failed == {"*": reason}``
    and is left in place.
    """
    shell = _shell(shell)
    try:
        modules, values = _read(path)
    except Exception as exc:
        return Summary(restored=[], modules={}, failed={"*": _reason(exc)})
    user_ns = shell.user_ns
    namespace = shell.user_global_ns
    missing = object()
    builtins = namespace.get("__builtins__", missing)
    imported: dict[str, str] = {}
    restored: list[str] = []
    failed: dict[str, str] = {}
    try:
        for name, module in modules.items():
            try:
                user_ns[name] = importlib.import_module(module)
            except Exception as exc:
                failed[name] = _reason(exc)
            else:
                imported[name] = module
        for name, data in values.items():
            try:
                user_ns[name] = _Unpickler(data, namespace).load()
            except Exception as exc:
                failed[name] = _reason(exc)
            else:
                restored.append(name)
    finally:
        # cloudpickle sets the functions' __builtins__ to its own (a dict)
        if builtins is missing:
            namespace.pop("__builtins__", None)
        else:
            namespace["__builtins__"] = builtins
    with contextlib.suppress(OSError):
        os.unlink(path)
    return Summary(restored=restored, modules=imported, failed=failed)
