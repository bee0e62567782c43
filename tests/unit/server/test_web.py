"""The web page's files and headers, in-process (the page itself is tested end to
end in tests/integration/test_web.py)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from kernelgw.server import create_app
from kernelgw.server.web import STATIC_DIR

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # the page's routes need no backend: no lifespan
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        yield c


def csp_directives(header: str) -> dict[str, list[str]]:
    out = {}
    for part in header.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


async def test_page_has_a_strict_content_security_policy(client: httpx.AsyncClient) -> None:
    resp = await client.get("/")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/html; charset=utf-8"
    csp = csp_directives(resp.headers["content-security-policy"])
    assert csp["default-src"] == ["'none'"]
    assert csp["script-src"] == ["'self'"]  # no inline script, no eval, nothing from elsewhere
    assert csp["connect-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["object-src"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"]
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert resp.headers["x-frame-options"] == "DENY"


async def test_assets_are_served_by_name_only(client: httpx.AsyncClient) -> None:
    for name, media_type in [
        ("app.js", "text/javascript"),
        ("render.js", "text/javascript"),
        ("style.css", "text/css"),
        ("favicon.svg", "image/svg+xml"),
    ]:
        resp = await client.get(f"/static/{name}")
        assert resp.status_code == 200, name
        assert resp.headers["content-type"].startswith(media_type)
        assert "script-src 'self'" in resp.headers["content-security-policy"]
    for bad in ["/static/index.html.bak", "/static/__init__.py", "/static/..%2F__init__.py", "/static/"]:
        resp = await client.get(bad)
        assert resp.status_code == 404, bad
        assert resp.json()["error"]["code"] == "not_found"
    resp = await client.get("/favicon.ico", follow_redirects=False)
    assert resp.status_code == 308 and resp.headers["location"] == "/static/favicon.svg"


async def test_page_is_not_in_the_api_schema() -> None:
    paths = create_app().openapi()["paths"]
    assert "/" not in paths and not any(p.startswith("/static") for p in paths)


class _Audit(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self.in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "script":
            self.in_script = True
            if "src" not in names:
                self.problems.append("inline <script>")
        if tag == "style":
            self.problems.append("inline <style>")
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"event handler attribute {name}")
            if name == "style":
                self.problems.append("style attribute")
            if value and value.strip().lower().startswith("javascript:"):
                self.problems.append(f"javascript: URL in {name}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_script = False

    def handle_data(self, data: str) -> None:
        if self.in_script and data.strip():
            self.problems.append("script content")


def test_index_html_has_nothing_inline() -> None:
    audit = _Audit()
    audit.feed((STATIC_DIR / "index.html").read_text())
    assert audit.problems == []


def test_scripts_never_turn_kernel_output_into_page_html() -> None:
    """Kernel output reaches the page as text nodes, or as HTML only in sandboxed frames."""
    for name in ("app.js", "render.js"):
        source = (STATIC_DIR / name).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in source, f"{name} uses {sink}"
        code = re.sub(r"^\s*//.*$|\s//\s.*$", "", source, flags=re.MULTILINE)  # not the comments
        assert "allow-scripts" not in code and "allow-same-origin" not in code
    render = (STATIC_DIR / "render.js").read_text()
    assert re.search(r'setAttribute\("sandbox", ""\)', render)
    assert "iframe.srcdoc = " in render


def test_the_api_key_lives_in_session_storage_only() -> None:
    """The key goes in sessionStorage and the Authorization header: never
    localStorage, cookies, the console, or a URL (WebSockets get tokens)."""
    source = (STATIC_DIR / "app.js").read_text()
    code = re.sub(r"^\s*//.*$|\s//\s.*$", "", source, flags=re.MULTILINE)
    assert "sessionStorage" in code
    for leak in ("localStorage", "document.cookie", "console."):
        assert leak not in code, leak
    assert "authorization = `Bearer ${used}`" in code
    assert "token=${encodeURIComponent(token)}" in code
    page = (STATIC_DIR / "index.html").read_text()
    assert re.search(r'<input id="api-key" type="password"', page)
    assert "kernelgw keys create" in page


def test_every_static_file_ships_as_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["kernelgw.server.web"]
    files = [p.relative_to(STATIC_DIR.parent).as_posix() for p in STATIC_DIR.iterdir() if p.is_file()]
    assert "static/index.html" in files
    for path in files:
        assert any(fnmatch.fnmatch(path, pat) for pat in patterns), f"{path} would be missing from a wheel"
