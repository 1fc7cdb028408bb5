"""The chat page at `/`: static files shipped in the package (astrai/serve/ui/), served
with no key so a browser can load them, while every /v1 route they call stays behind the
API key (the page asks for the key when the server answers 401).

The files are read once when the app is built, from the installed package (importlib
resources), and only the names in ASSETS are served: no path from the URL ever reaches the
file system. Each response carries a Content-Security-Policy that allows scripts, styles
and connections from this origin only and no inline script (MDN, "Content-Security-Policy"),
so text a model writes can never run as code even if a rendering bug let markup through.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from astrai.serve.errors import APIError

PAGE = "index.html"
ASSETS = {"app.js": "text/javascript; charset=utf-8",
          "markdown.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}
"""The files under /ui/ and their media types (ES modules need a JavaScript type)."""

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; object-src 'none'; "
                               "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def read_files() -> dict[str, bytes]:
    """The page and its assets, by name, from the installed package."""
    root = resources.files("astrai.serve").joinpath("ui")
    return {name: root.joinpath(name).read_bytes() for name in (PAGE, *ASSETS)}


def add_page_routes(app: FastAPI) -> None:
    """GET / (the page) and GET /ui/NAME (its scripts and style sheet)."""
    files = read_files()

    @app.get("/")
    async def page() -> Response:
        return Response(files[PAGE], media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/ui/{name}")
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise APIError(404, f"no page asset '{name}'", type="not_found_error")
        return Response(files[name], media_type=ASSETS[name], headers=HEADERS)
