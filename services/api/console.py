"""The operator console at ``/ui/`` and the API documentation at ``/docs`` and ``/redoc``, served
from files inside the package: no build step at run time, nothing from another origin.

The console (``ui/``) is plain ES modules, a stylesheet and an SVG icon; it signs in with a
bearer token and then calls the same API any client calls. The documentation pages load Swagger
UI and ReDoc from the copies the ``fastapi-offline`` package ships, so they work on a network
with no way out. Every page carries a strict Content-Security-Policy: scripts, styles and
connections from this origin only, no inline script, no HTML parsed from strings in the console
(Trusted Types), no framing. docs/console.md describes the console; docs/operations.md how to
put it behind a proxy.

The files are open (no token): they hold no data, only the code that asks for it.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.responses import RedirectResponse

UI_DIR = Path(__file__).parent / "ui"

#: The console: this origin only, and no HTML sink (innerHTML and friends) even for its own
#: code, so a field's text can never become markup.
CONSOLE_CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "font-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)
#: Swagger UI and ReDoc: this origin only as well, but they set inline styles and ReDoc runs a
#: worker from a blob.
DOCS_CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self' data:",
        "worker-src 'self' blob:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
_COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Revalidate every time (cheap: an ETag), so an upgraded API never runs an old console.
    "Cache-Control": "no-cache",
}
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}


@dataclass
class Asset:
    """One file, read on first use and kept: its bytes, media type and ETag."""

    path: Path
    csp: str
    _body: bytes | None = field(default=None, repr=False)
    _etag: str = ""

    @property
    def media_type(self) -> str:
        return _MEDIA_TYPES[self.path.suffix]

    def response(self, request: Request) -> Response:
        if self._body is None:
            self._body = self.path.read_bytes()
            self._etag = '"' + hashlib.sha256(self._body).hexdigest()[:32] + '"'
        headers = {**_COMMON_HEADERS, "ETag": self._etag, "Content-Security-Policy": self.csp}
        if request.headers.get("if-none-match") == self._etag:
            return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
        return Response(self._body, media_type=self.media_type, headers=headers)


def _console_assets() -> dict[str, Asset]:
    """Every servable file under ui/ by its path there (the docs/ init scripts excluded)."""
    return {
        path.relative_to(UI_DIR).as_posix(): Asset(path, CONSOLE_CSP)
        for path in sorted(UI_DIR.rglob("*"))
        if path.is_file() and path.suffix in _MEDIA_TYPES and path.parent.name != "docs"
    }


def _docs_assets() -> dict[str, Asset]:
    shipped = Path(str(importlib.resources.files("fastapi_offline") / "static"))
    files = {
        "swagger-ui-bundle.js": shipped / "swagger-ui-bundle.js",
        "swagger-ui.css": shipped / "swagger-ui.css",
        "redoc.standalone.js": shipped / "redoc.standalone.js",
        "swagger-init.js": UI_DIR / "docs" / "swagger-init.js",
        "redoc-init.js": UI_DIR / "docs" / "redoc-init.js",
        "favicon.svg": UI_DIR / "favicon.svg",
    }
    return {name: Asset(path, DOCS_CSP) for name, path in files.items()}


def _docs_page(title: str, body: str) -> bytes:
    return f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  <link rel="icon" href="/docs/assets/favicon.svg" type="image/svg+xml">
{body}
</html>
""".encode()


_SWAGGER_PAGE = _docs_page(
    "taskfleet API - Swagger UI",
    """  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/assets/swagger-init.js"></script>
</body>""",
)
_REDOC_PAGE = _docs_page(
    "taskfleet API - ReDoc",
    """</head>
<body>
  <div id="redoc"></div>
  <script src="/docs/assets/redoc.standalone.js"></script>
  <script src="/docs/assets/redoc-init.js"></script>
</body>""",
)


def _page(body: bytes, csp: str) -> Response:
    headers = {**_COMMON_HEADERS, "Content-Security-Policy": csp}
    return Response(body, media_type=_MEDIA_TYPES[".html"], headers=headers)


def _not_found(what: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"{what} not found")


def create_router() -> APIRouter:
    """The routes of the console and the documentation pages (none in the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)
    console = _console_assets()
    docs = _docs_assets()

    @router.get("/ui")
    async def console_redirect() -> RedirectResponse:
        # The console's modules are addressed relative to /ui/.
        return RedirectResponse("/ui/", status_code=status.HTTP_308_PERMANENT_REDIRECT)

    @router.get("/ui/")
    async def console_page(request: Request) -> Response:
        return console["index.html"].response(request)

    @router.get("/ui/{name:path}")
    async def console_file(name: str, request: Request) -> Response:
        asset = console.get(name)
        if asset is None:
            raise _not_found(f"console file {name!r}")
        return asset.response(request)

    @router.get("/docs")
    async def swagger_page() -> Response:
        return _page(_SWAGGER_PAGE, DOCS_CSP)

    @router.get("/redoc")
    async def redoc_page() -> Response:
        return _page(_REDOC_PAGE, DOCS_CSP)

    @router.get("/docs/assets/{name}")
    async def docs_file(name: str, request: Request) -> Response:
        asset = docs.get(name)
        if asset is None:
            raise _not_found(f"documentation file {name!r}")
        return asset.response(request)

    return router
