"""``GET /ui``: a page that decodes a dropped latents file — a video model's video played while it
decodes (fragmented MP4 through Media Source Extensions), an image model's images as PNG —
showing this request's progress (whether the server is compiling its size, the frames or bytes
that have come) and offering the result for download, with the model (a server of several: the
one chosen in its select), the mesh's bands, the queue and the compiled programs beside it. The page is three static files shipped in the package (``static/``: the HTML, its
script ``/ui/app.js`` and its style ``/ui/app.css``; nothing inline, so a strict
Content-Security-Policy holds); it calls the public API like any client (with the API key typed
into it, when one is set)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)

_STATIC = files("vaeserve.service.http").joinpath("static")
_PAGE = _STATIC.joinpath("ui.html").read_text(encoding="utf-8")
_ASSETS = {"app.js": ("text/javascript", _STATIC.joinpath("app.js").read_bytes()),
           "app.css": ("text/css", _STATIC.joinpath("app.css").read_bytes())}


@router.get("/ui")
async def ui() -> HTMLResponse:
    return HTMLResponse(_PAGE)


@router.get("/ui/app.js")
async def script() -> Response:
    media_type, body = _ASSETS["app.js"]
    return Response(body, media_type=media_type)


@router.get("/ui/app.css")
async def style() -> Response:
    media_type, body = _ASSETS["app.css"]
    return Response(body, media_type=media_type)
