"""The console's and the documentation's files as the API serves them: every one from this
origin, under a strict Content-Security-Policy, nothing else reachable under /ui/.

No database is needed (the app is built, its lifespan never runs). The browser tests
(tests/e2e/test_console_browser.py) check the same pages as a browser loads them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from taskfleet.api.app import create_app
from taskfleet.api.console import CONSOLE_CSP, DOCS_CSP, UI_DIR
from taskfleet.shared.settings import ApiSettings

MODULE_IMPORT = re.compile(r"""^import\s.*?from\s+"(\.{1,2}/[^"]+)";""", re.MULTILINE | re.DOTALL)
CONSOLE_JS = sorted(p for p in UI_DIR.rglob("*.js") if p.parent.name != "docs")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(
        database_url="postgresql://nobody@127.0.0.1:1/none", api_tokens="admin:console-files-0001"
    )
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


def directives(csp: str) -> dict[str, list[str]]:
    parsed = {}
    for part in csp.split(";"):
        name, *values = part.split()
        parsed[name] = values
    return parsed


async def test_the_console_page_has_a_strict_policy(http: httpx.AsyncClient) -> None:
    response = await http.get("/ui/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    csp = directives(response.headers["content-security-policy"])
    assert csp["default-src"] == ["'none'"]
    for name in ("script-src", "style-src", "connect-src", "img-src", "font-src"):
        assert csp[name] == ["'self'"], name
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["require-trusted-types-for"] == ["'script'"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"


async def test_ui_without_the_slash_redirects(http: httpx.AsyncClient) -> None:
    response = await http.get("/ui", follow_redirects=False)
    assert response.status_code == 308
    assert response.headers["location"] == "/ui/"


async def test_every_module_the_console_imports_is_served_with_a_script_type(
    http: httpx.AsyncClient,
) -> None:
    index = (UI_DIR / "index.html").read_text()
    wanted = {"app.js", "console.css", "favicon.svg"}
    for name in wanted:
        assert f'"{name}"' in index, name
    for path in CONSOLE_JS:
        for target in MODULE_IMPORT.findall(path.read_text()):
            wanted.add(posixpath.normpath((path.parent / target).relative_to(UI_DIR).as_posix()))
    assert {"fragment.js", "views/config.js", "convergence.js"} <= wanted
    for name in sorted(wanted):
        response = await http.get(f"/ui/{name}")
        assert response.status_code == 200, name
        if name.endswith(".js"):
            assert response.headers["content-type"].startswith("text/javascript"), name


@pytest.mark.parametrize("path", [*CONSOLE_JS, UI_DIR / "index.html", UI_DIR / "console.css"])
def test_no_console_file_points_anywhere_else_or_parses_html(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), path
    if path.suffix == ".js":
        for sink in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ):
            assert sink not in text, f"{path.name}: {sink}"


@pytest.mark.parametrize(
    "path",
    [
        "/ui/../pyproject.toml",
        "/ui/%2e%2e/app.py",
        "/ui/package.json",
        "/ui/docs/swagger-init.js",
        "/ui/nothing.js",
        "/ui/views",
    ],
)
async def test_nothing_but_the_console_files_is_served(http: httpx.AsyncClient, path: str) -> None:
    assert (await http.get(path)).status_code == 404


async def test_files_are_revalidated_by_etag(http: httpx.AsyncClient) -> None:
    first = await http.get("/ui/app.js")
    assert first.headers["cache-control"] == "no-cache"
    again = await http.get("/ui/app.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304
    assert again.content == b""


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_documentation_loads_only_its_own_files(
    http: httpx.AsyncClient, page: str
) -> None:
    response = await http.get(page)
    assert response.status_code == 200
    assert directives(response.headers["content-security-policy"])["script-src"] == ["'self'"]
    assert response.headers["content-security-policy"] == DOCS_CSP
    html = response.text
    assert "http" not in html and "//" not in html.replace("<!doctype", "")
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("/docs/assets/") for s in sources), sources
    for source in sources:
        assert (await http.get(source)).status_code == 200, source
    assert CONSOLE_CSP != DOCS_CSP
