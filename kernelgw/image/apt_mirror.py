"""Which Debian mirror the host's apt uses, so debootstrap fetches from the same place.

Pure parsing of ``/etc/apt`` (deb822 ``*.sources`` and one-line ``*.list``
files); security and source-only entries are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

DEBOOTSTRAP_SUITE = "bookworm"
"""The Debian release the debootstrap base is made from."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    key: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith("#"):
            continue
        if not line.strip():
            if stanza:
                yield stanza
            stanza, key = {}, None
            continue
        if line[0] in " \t" and key is not None:
            stanza[key] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        key = name.strip().lower()
        stanza[key] = value.strip()
    if stanza:
        yield stanza


def _usable_uri(uri: str) -> bool:
    return uri.split(":", 1)[0] in ("http", "https", "ftp", "file")


def _pick_mirror(entries: Iterable[tuple[str, list[str]]], suite: str) -> str | None:
    """Prefer an entry serving ``suite``, then any URI ending in /debian."""
    candidates = [
        (uri, suites)
        for uri, suites in entries
        if _usable_uri(uri) and not uri.rstrip("/").endswith("-security") and not any("security" in s for s in suites)
    ]
    for uri, suites in candidates:
        if suite in suites:
            return uri.rstrip("/")
    for uri, _ in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    return None


def parse_deb822_mirror(text: str, suite: str = DEBOOTSTRAP_SUITE) -> str | None:
    """The Debian mirror of a deb822 ``*.sources`` file, or None."""
    entries: list[tuple[str, list[str]]] = []
    for st in _deb822_stanzas(text):
        if "deb" not in st.get("types", "").split():
            continue
        if st.get("enabled", "yes").lower() == "no":
            continue
        suites = st.get("suites", "").split()
        entries.extend((uri, suites) for uri in st.get("uris", "").split())
    return _pick_mirror(entries, suite)


def parse_sources_list_mirror(text: str, suite: str = DEBOOTSTRAP_SUITE) -> str | None:
    """The Debian mirror of a one-line-style ``sources.list``, or None."""
    entries: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)  # [arch=amd64 signed-by=...]
        parts = line.split()
        if len(parts) < 3 or parts[0] != "deb":
            continue
        entries.append((parts[1], [parts[2]]))
    return _pick_mirror(entries, suite)


def find_apt_mirror(apt_dir: Path = Path("/etc/apt"), suite: str = DEBOOTSTRAP_SUITE) -> str:
    """The mirror apt is configured with, or :data:`DEFAULT_MIRROR`."""
    sources_d = apt_dir / "sources.list.d"
    files: list[tuple[Path, bool]] = []
    if sources_d.is_dir():
        files += [(p, True) for p in sorted(sources_d.glob("*.sources"))]
    files.append((apt_dir / "sources.list", False))
    if sources_d.is_dir():
        files += [(p, False) for p in sorted(sources_d.glob("*.list"))]
    for path, deb822 in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        mirror = (parse_deb822_mirror if deb822 else parse_sources_list_mirror)(text, suite)
        if mirror:
            return mirror
    return DEFAULT_MIRROR
