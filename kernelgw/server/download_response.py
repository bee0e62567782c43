"""A workspace file streamed out of its container (`/v1`'s and E2B's downloads)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi.responses import StreamingResponse

from kernelgw.runtime.workspace import Download


class DownloadResponse(StreamingResponse):
    """Closes the container's file helper when the response ends, also when the
    client went away mid-transfer (then the body generator stays suspended and
    would otherwise keep the helper's process and connection until garbage
    collection). ``body``: the bytes as sent, when not the file's own (gzipped)."""

    def __init__(self, download: Download, body: AsyncIterator[bytes] | None = None, **kwargs: Any) -> None:
        super().__init__(body if body is not None else download.chunks, **kwargs)
        self.download = download

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.download.aclose()
