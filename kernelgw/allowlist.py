"""The operator's package allowlist: what sessions may ask to install.

Here rather than in ``kernelgw.runtime.packages`` because the settings check the
allowlist when they load, and settings sit below the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

# packaging is imported where it is used: it cost every start ~15 ms of CPU before the
# first answer, and only the package routes need it (tests/unit/test_startup_imports.py)
if TYPE_CHECKING:
    from packaging.requirements import Requirement


def normalize_name(name: str) -> str:
    """PEP 503: ``Foo.Bar_baz`` -> ``foo-bar-baz``."""
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def parse_allowlist(entries: Iterable[str]) -> dict[str, Requirement]:
    """Normalised name -> the operator's requirement (name and optional specifier)."""
    allowed: dict[str, Requirement] = {}
    entries = list(entries)
    if not entries:  # the default (the settings check it at every start): packaging stays unimported
        return allowed
    from packaging.requirements import InvalidRequirement, Requirement

    for entry in entries:
        try:
            req = Requirement(entry)
        except InvalidRequirement as exc:
            raise ValueError(f"package_allowlist entry {entry!r} is not a requirement: {exc}") from exc
        if req.url or req.marker:
            raise ValueError(f"package_allowlist entry {entry!r}: URLs and markers are not supported")
        allowed[normalize_name(req.name)] = req
    return allowed
