"""``GET /ui``: a page that decodes a dropped latents file and plays the video while it decodes
(fragmented MP4 through Media Source Extensions), with the queue, the mesh's bands and the
compiled programs beside it. The page is a static file shipped in the package; it calls the
public API like any client (with the API key typed into it, when one is set)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()

_PAGE = files("service.http").joinpath("static/ui.html").read_text(encoding="utf-8")


@router.get("/ui", include_in_schema=False)
async def ui() -> HTMLResponse:
    return HTMLResponse(_PAGE)
