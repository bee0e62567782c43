"""The route class a face (Jupyter's, E2B's) gives its routers, so that every
error of its routes comes out in that face's wire shape."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

ErrorShape = Callable[[Request, Exception], Response | None]
"""A face's error as its clients read it; None: not one it shapes (raised on)."""


def face_route(shape: ErrorShape, name: str) -> type[APIRoute]:
    """An APIRoute class whose handlers' exceptions go through ``shape``."""

    class FaceRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    return await handler(request)
                except Exception as exc:
                    response = shape(request, exc)
                    if response is None:
                        raise
                    return response

            return route

    FaceRoute.__name__ = FaceRoute.__qualname__ = name
    return FaceRoute
