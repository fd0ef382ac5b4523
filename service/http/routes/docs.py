"""``GET /docs`` (Swagger UI) and ``GET /redoc`` (Redoc): pages of the OpenAPI document whose
scripts and styles come from the package (``static/docs/assets``: swagger-ui-dist and Redoc,
unmodified, with their licences; mounted at ``/docs/assets`` by the app), so they work on hosts
without internet access. Swagger UI's set-up is a file too (``swagger-init.js``), not an inline
script: Swagger UI runs under the policy of every page (``service.http.middleware``), Redoc under
one that also lets it make its styles and its search worker."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from ..middleware import CONTENT_SECURITY_POLICY, REDOC_POLICY

router = APIRouter(include_in_schema=False)

_DOCS = files("vaeserve.service.http").joinpath("static/docs")
_SWAGGER = _DOCS.joinpath("swagger.html").read_text(encoding="utf-8")
_REDOC = _DOCS.joinpath("redoc.html").read_text(encoding="utf-8")
ASSETS_PATH = "/docs/assets"
# Redoc 2 shows Redocly's logo from their CDN, unconditionally: offline (and under the page's
# policy, which allows no other origin) that request fails and the browser logs it. Its bundle is
# served with that one address replaced by an empty image, which Redoc's own error handler hides.
_REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"


def assets() -> StaticFiles:
    """The pages' scripts, styles and the licences of what they vendor, for ``ASSETS_PATH``."""
    return StaticFiles(directory=str(_DOCS.joinpath("assets")))


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return HTMLResponse(_SWAGGER)  # PAGE_POLICY, as every page


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return HTMLResponse(_REDOC, headers={CONTENT_SECURITY_POLICY: REDOC_POLICY})


@router.get(ASSETS_PATH + "/redoc/redoc.standalone.js")  # before the mount of the other assets
async def redoc_script() -> Response:
    return Response(_redoc_bundle(), media_type="text/javascript; charset=utf-8")


@cache
def _redoc_bundle() -> bytes:
    bundle = _DOCS.joinpath("assets/redoc/redoc.standalone.js").read_bytes()
    assert bundle.count(_REDOC_LOGO) == 1, "another Redoc: check what it loads from elsewhere"
    return bundle.replace(_REDOC_LOGO, b"data:,")
