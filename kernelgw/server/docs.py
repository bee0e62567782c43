"""The API's description (OpenAPI schema, Swagger UI, ReDoc), behind the key when
keys exist: the schema names every route and model, which is reconnaissance for
a caller with no key. A browser, which cannot send the key header, opens
``/docs?token=`` with a token from ``POST /v1/auth/token``."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from kernelgw.errors import Unauthorized
from kernelgw.keys import Principal
from kernelgw.server.state import gateway_state

router = APIRouter(include_in_schema=False)

NEEDS_KEY = (
    "The API description needs a valid API key while keys exist: send 'Authorization: Bearer <key>', or "
    "open /docs?token=<token> with a token from POST /v1/auth/token."
)


async def reader(request: Request) -> Principal:
    try:
        return await gateway_state(request).auth.from_key_or_token(
            request.headers.get("authorization"), request.query_params.get("token")
        )
    except Unauthorized as exc:
        raise Unauthorized(NEEDS_KEY) from exc


def _schema_url(request: Request) -> str:
    token = request.query_params.get("token")
    return "/openapi.json" + (f"?token={quote(token, safe='')}" if token else "")


@router.get("/openapi.json", dependencies=[Depends(reader)])
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs", dependencies=[Depends(reader)])
async def swagger(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=_schema_url(request), title="kernelgw API")


@router.get("/redoc", dependencies=[Depends(reader)])
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_schema_url(request), title="kernelgw API")
