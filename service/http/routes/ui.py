"""``GET /ui``: a page that decodes a dropped latents file and plays the video while it decodes
(fragmented MP4 through Media Source Extensions), with the queue, the mesh's bands and the
compiled programs beside it. The page, its script (``/ui/app.js``) and its styles
(``/ui/app.css``) are static files shipped in the package — no inline script or style, so the
page's Content-Security-Policy (``service.http.middleware``) allows this origin's files only. It
calls the public API like any client (with the API key typed into it, when one is set)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)

_STATIC = files("service.http").joinpath("static")
_PAGE = _STATIC.joinpath("ui.html").read_text(encoding="utf-8")
_SCRIPT = _STATIC.joinpath("ui.js").read_bytes()
_STYLE = _STATIC.joinpath("ui.css").read_bytes()


@router.get("/ui")
async def ui() -> HTMLResponse:
    return HTMLResponse(_PAGE)


@router.get("/ui/app.js")
async def ui_script() -> Response:
    return Response(_SCRIPT, media_type="text/javascript; charset=utf-8")


@router.get("/ui/app.css")
async def ui_style() -> Response:
    return Response(_STYLE, media_type="text/css; charset=utf-8")
