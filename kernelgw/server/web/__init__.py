"""The web page: a small notebook-like UI at ``/``, plain HTML/JS/CSS, no build step.

The files live in ``static/`` (shipped as package data). The page gets a strict
Content-Security-Policy: scripts only from the gateway's own files (no inline
script, no eval), no plugins, no framing by other sites, network only to the
gateway itself. Kernel HTML output (DataFrames, ``IPython.display.HTML``) is
rendered by the page in ``<iframe sandbox srcdoc=...>`` frames without
``allow-scripts`` or ``allow-same-origin``, which also inherit this policy;
inline styles are allowed because pandas styles its tables with a ``<style>``
element.

With API keys the page asks for one when ``/v1/auth/whoami`` answers 401, keeps
it in the tab's ``sessionStorage`` only, sends it as ``Authorization: Bearer``,
and opens WebSockets with short-lived tokens from ``POST /v1/auth/token``; the
page itself and its assets need no key.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, RedirectResponse

STATIC_DIR = Path(str(files(__name__) / "static"))

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "frame-src 'self'",
        "font-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "object-src 'none'",
    ]
)

# Only these files are served, each with its type: no directory walking.
_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "render.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/favicon.ico")
async def favicon() -> RedirectResponse:
    return RedirectResponse("/static/favicon.svg", status_code=308)


@router.get("/static/{name}")
async def asset(name: str) -> FileResponse:
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404, f"No file {name!r} in the web page's assets.")
    return FileResponse(STATIC_DIR / name, media_type=media_type, headers=_HEADERS)
