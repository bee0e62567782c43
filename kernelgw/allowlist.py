"""The operator's package allowlist: what sessions may ask to install.

Here rather than in ``kernelgw.runtime.packages`` because the settings check the
allowlist when they load, and settings sit below the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name


def normalize_name(name: str) -> str:
    """PEP 503: ``Foo.Bar_baz`` -> ``foo-bar-baz``."""
    return canonicalize_name(name)


def parse_allowlist(entries: Iterable[str]) -> dict[str, Requirement]:
    """Normalised name -> the operator's requirement (name and optional specifier)."""
    allowed: dict[str, Requirement] = {}
    for entry in entries:
        try:
            req = Requirement(entry)
        except InvalidRequirement as exc:
            raise ValueError(f"package_allowlist entry {entry!r} is not a requirement: {exc}") from exc
        if req.url or req.marker:
            raise ValueError(f"package_allowlist entry {entry!r}: URLs and markers are not supported")
        allowed[normalize_name(req.name)] = req
    return allowed
