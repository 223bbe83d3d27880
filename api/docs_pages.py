"""``/redoc`` with nothing from the internet, its side-menu logo included.

fastapi-offline ships ReDoc's script, but the script itself asks Redocly's CDN for the small
logo at the foot of its side menu (``https://cdn.redoc.ly/redoc/logo-mini.svg``): offline the
browser made a request that failed, and a first user saw it in the network log (issue 36).
Here the page loads a copy of the shipped script in which that one address names a picture
the app serves (``api/static/redoc-logo.svg``); the copy is made once per process, in memory.
Swagger UI (``/docs``) needs nothing of this: fastapi-offline serves it whole.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import FileResponse, HTMLResponse, Response

REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
ASSETS = "/docs-local"
"""Where the patched script and the logo are served (apart from fastapi-offline's mount)."""
LOGO = Path(__file__).parent / "static" / "redoc-logo.svg"
SHIPPED_REDOC = Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js"

router = APIRouter(include_in_schema=False)


@cache
def redoc_script() -> bytes:
    """The shipped ReDoc script with its logo served by the app. A ReDoc that no longer names
    the CDN logo is served as shipped (nothing to replace; the browser test still checks)."""
    return SHIPPED_REDOC.read_bytes().replace(REDOC_CDN_LOGO, f"{ASSETS}/redoc-logo.svg".encode())


@router.get("/redoc")
async def redoc_page(request: Request) -> HTMLResponse:
    app: FastAPI = request.app
    root = request.scope.get("root_path", "")
    return get_redoc_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
        with_google_fonts=False,
    )


@router.get(f"{ASSETS}/redoc.standalone.js")
async def redoc_js() -> Response:
    return Response(
        redoc_script(),
        media_type="text/javascript",
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.get(f"{ASSETS}/redoc-logo.svg")
async def redoc_logo() -> FileResponse:
    return FileResponse(LOGO, media_type="image/svg+xml")


@router.get(f"{ASSETS}/favicon.png")
async def favicon() -> FileResponse:
    return FileResponse(SHIPPED_REDOC.with_name("favicon.png"), media_type="image/png")
