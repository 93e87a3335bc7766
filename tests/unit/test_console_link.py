"""The console link of ``taskfleet dev``: the admin token in the fragment, never in the path or
the query (a fragment is not sent to the server)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import pytest

from taskfleet.cli.console_link import console_url
from taskfleet.cli.dev import Child, _banner


def test_the_token_goes_in_the_fragment_escaped() -> None:
    url = console_url("http://127.0.0.1:8000", "a&b #c/d")
    parts = urlsplit(url)
    assert (parts.path, parts.query) == ("/ui/", "")
    assert parts.fragment == "token=a%26b%20%23c%2Fd"
    assert unquote(parts.fragment.removeprefix("token=")) == "a&b #c/d"


def test_without_a_token_the_link_is_the_console_alone() -> None:
    assert console_url("http://127.0.0.1:8000/", None) == "http://127.0.0.1:8000/ui/"


def test_the_dev_banner_prints_the_console_link_with_the_admin_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = Child("api", ["taskfleet", "api"], "http://127.0.0.1:8000/healthz", ready=True)
    _banner(
        [api],
        api_base="http://127.0.0.1:8000",
        database="embedded",
        tokens={"adm-token-123": "admin", "sub-token-456": "submit"},
        tokens_generated=True,
    )
    lines = capsys.readouterr().out.splitlines()
    assert "  console   http://127.0.0.1:8000/ui/#token=adm-token-123" in lines


def test_with_auth_off_the_banner_links_the_console_without_a_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = Child("api", ["taskfleet", "api"], "http://127.0.0.1:8000/healthz", ready=True)
    _banner(
        [api], api_base="http://127.0.0.1:8000", database="x", tokens=None, tokens_generated=False
    )
    assert "  console   http://127.0.0.1:8000/ui/" in capsys.readouterr().out.splitlines()
